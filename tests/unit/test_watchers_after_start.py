"""The running job's watchers start right after the first attempt's processes, not before
(fluidctl/launch/run.py ``run_supervised``): their threads are on the path to every rank.

run_supervised makes its process a child subreaper (orphans of its job become its children):
it runs in a child process here, never in the test runner, which would then hold other
tests' orphans as zombies."""
import json
import subprocess
import sys

SUPERVISED = """
import json, sys
from fluidctl.launch import run
from fluidctl.launch.supervisor import LaunchLog, RunOptions
from fluidctl.procs.local import LocalProcess

calls = []


class Channel:
    # a checkpoint channel that records what is asked of it, in order
    signal = 15

    def clear(self):
        calls.append("clear")

    def stopped(self):
        return None

    def watch_commits(self, emit):
        calls.append("watch_commits")
        return self

    def stop(self):
        calls.append("stop")


log = sys.argv[1]


def start(attempt):
    calls.append(f"start {attempt}")
    return [LocalProcess("trainer 0", [sys.executable, "-c", f"raise SystemExit({1 - attempt})"],
                         {}, log)]


result = run.run_supervised(start, logs=[log], launch_log=LaunchLog(),
                            options=RunOptions(1.0, 1, Channel()),
                            shown=run.ConsoleOutput(sources=[]))
print(json.dumps({"code": result.exit_code, "attempts": result.attempts, "calls": calls}))
"""


def test_the_commit_watcher_starts_after_the_first_attempts_processes_and_once(tmp_path):
    done = subprocess.run([sys.executable, "-c", SUPERVISED, str(tmp_path / "workerlog.0")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["code"] == 0 and out["attempts"] == 2
    assert out["calls"] == ["clear", "start 0", "watch_commits", "clear", "start 1", "stop"]
