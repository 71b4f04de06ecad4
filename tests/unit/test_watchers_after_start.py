"""The running job's watchers start right after the first attempt's processes, not before
(fluidctl/launch/run.py ``run_supervised``): their threads are on the path to every rank."""
import sys

from fluidctl.launch import run
from fluidctl.launch.supervisor import LaunchLog, RunOptions
from fluidctl.procs.local import LocalProcess


class Channel:
    """A checkpoint channel that records what is asked of it, in order."""

    def __init__(self, calls):
        self.calls = calls
        self.signal = 15

    def clear(self):
        self.calls.append("clear")

    def stopped(self):
        return None

    def watch_commits(self, emit):
        self.calls.append("watch_commits")
        return self

    def stop(self):
        self.calls.append("stop")


def test_the_commit_watcher_starts_after_the_first_attempts_processes_and_once(tmp_path):
    calls = []
    logs = [str(tmp_path / "workerlog.0")]

    def start(attempt):
        calls.append(f"start {attempt}")
        return [LocalProcess("trainer 0", [sys.executable, "-c", f"raise SystemExit({1 - attempt})"],
                             {}, logs[0])]
    result = run.run_supervised(start, logs=logs, launch_log=LaunchLog(),
                                options=RunOptions(1.0, 1, Channel(calls)),
                                shown=run.ConsoleOutput(sources=[]))
    assert result.exit_code == 0 and result.attempts == 2
    assert calls == ["clear", "start 0", "watch_commits", "clear", "start 1", "stop"]
