"""The first attempt's processes start before the supervisor's modules are loaded
(fluidctl/launch/firststart.py): in the launcher (``launch.execute``: srun, the SSH plans, the
local ranks) and in a node agent, whose ranks start as soon as its plan arrives.

Each supervised run happens in a child process, never in the test runner (run_supervised
makes its process a child subreaper, which would hold other tests' orphans)."""
import json
import signal
import subprocess
import sys
import threading

import pytest

from fluidctl.agentproto import ENDS_TAG, MARK, PROBE_TAG, NodeShare
from fluidctl.planning.plan import ProcSpec
from launchutil import BEHAVE, HELD_AGENT, HELD_FLUIDCTL, assert_all_gone, read_pids, wait_for

# `fluidctl train` with a record, at each local process's start, of whether the supervisor's
# module had been imported by then
LAUNCHER = """
import sys
from fluidctl.procs import local

loaded = []
init = local.LocalProcess.__init__


def recording(self, *args, **kwargs):
    loaded.append("fluidctl.launch.run" in sys.modules)
    init(self, *args, **kwargs)


local.LocalProcess.__init__ = recording
import atexit
atexit.register(lambda: print("supervisor loaded at each start:", loaded, flush=True))
from fluidctl.cli import main
main(sys.argv[1:])
"""


def test_the_launcher_starts_the_ranks_before_it_loads_their_supervisor(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello from', __import__('os').environ['PADDLE_TRAINER_ID'])\n")
    done = subprocess.run([sys.executable, "-c", LAUNCHER, "train", "--nproc", "2", "--tee",
                           "all", "--log-dir", str(tmp_path / "log"), str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "supervisor loaded at each start: [False, False]" in done.stdout
    # and the supervised run is whole: echo, logs, launch.log
    assert "hello from 0" in done.stdout and "hello from 1" in done.stdout
    assert (tmp_path / "log" / "workerlog.1").read_text() == "hello from 1\n"
    assert "all trainers finished" in (tmp_path / "log" / "launch.log").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_the_supervisor_loads_stops_the_job_as_any_other(tmp_path, sig):
    """The ranks run before the supervisor's handlers exist (fluidctl.launch.run's import is
    held): a Ctrl-C or TERM then is kept and acted on once they are, with the grace period,
    the message and exit code 128+N, not by Python's default (a traceback, or death)."""
    hold, pid_dir = tmp_path / "hold", tmp_path / "pids"
    pid_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HELD_FLUIDCTL, str(hold), "train",
                             "--nproc", "2", "--grace-period", "2", str(BEHAVE), "--hang",
                             "--pidfile", str(pid_dir)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 2, what="2 ranks ready")
        pids = read_pids(pid_dir, range(2))
        proc.send_signal(sig)
        hold.write_text("")             # the supervisor loads after the signal came
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out + err
        assert f"{signal.Signals(sig).name} received" in out, out + err
        assert "Traceback" not in err
        assert_all_gone(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _lines(proc, into: list) -> threading.Thread:
    def read():
        for line in proc.stdout:
            into.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_a_node_agent_starts_its_ranks_while_their_supervisor_loads(tmp_path):
    hold, started = tmp_path / "hold", tmp_path / "started"
    script = tmp_path / "rank.py"
    script.write_text(f"open({str(started)!r}, 'w').close()\nprint('rank ran')\n")
    rank = ProcSpec("trainer", 0, 0, 0, "127.0.0.1", "127.0.0.1:6170", [],
                    [sys.executable, "-u", str(script)], {}, "")
    share = NodeShare([rank.to_json()], str(tmp_path / "log"), "127.0.0.1", grace=1.0)
    proc = subprocess.Popen([sys.executable, "-c", HELD_AGENT, str(hold), "--ports", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "agent.err", "wb"), text=True, cwd=tmp_path)
    lines: list = []
    reader = _lines(proc, lines)
    try:
        wait_for(lambda: any(line.startswith(f"{MARK}{PROBE_TAG}|") for line in lines),
                 what="the agent's probe")
        proc.stdin.write(share.to_wire() + "\n")
        proc.stdin.flush()
        # the rank runs though fluidctl.launch.run has not finished importing
        try:
            wait_for(started.exists, timeout=30, what="the rank, with the supervisor held")
        except AssertionError:
            raise AssertionError((tmp_path / "agent.err").read_text() + "".join(lines))
        assert not hold.exists()
        hold.write_text("")
        assert proc.wait(timeout=60) == 0, (tmp_path / "agent.err").read_text()
        reader.join(10)
        ends = [json.loads(line.split("|", 1)[1]) for line in lines
                if line.startswith(f"{MARK}{ENDS_TAG}|")]
        assert [(e["label"], e["state"], e["returncode"]) for e in ends[0]] == \
            [("trainer 0", "finished", 0)]
        log = tmp_path / "log" / "127.0.0.1" / "workerlog.0"
        assert "rank ran" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


ABANDONED = """
import os, sys, time
from fluidctl.launch.firststart import FirstStart
from fluidctl.procs.local import LocalProcess

log = sys.argv[1]
first = FirstStart(lambda attempt: [LocalProcess("trainer 0", ["sleep", "60"], dict(os.environ),
                                                 log)], [log], grace=1.0)
print(first.handles[0].pid, flush=True)
first.abandon()             # e.g. an error before run_supervised took them over
print("abandoned", flush=True)
time.sleep(30)              # still alive: the process must be gone without our exit
"""


def test_processes_no_supervisor_took_over_are_stopped(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", ABANDONED, str(tmp_path / "workerlog.0")],
                            stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert proc.stdout.readline() == "abandoned\n"

        def gone() -> bool:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().split(") ", 1)[1].startswith("Z")     # not yet reaped
            except FileNotFoundError:
                return True
        wait_for(gone, timeout=10, what="the started process to be stopped")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_kept_log_is_echoed_from_where_it_ended_before_the_first_start(tmp_path):
    """A node agent's restart keeps its logs (``fresh`` False): what the new processes write
    is echoed from the size the log had before they started, not from when the echo began."""
    from fluidctl.launch.echo import LogEcho
    log = tmp_path / "workerlog.0"
    log.write_text("earlier attempt\n")
    sizes = {str(log): log.stat().st_size}
    with open(log, "a") as f:
        f.write("written before the echo started\n")
    out = []

    class Out:
        def write(self, text):
            out.append(text)

        def flush(self):
            pass
    echo = LogEcho([(str(log), "")], Out(), from_end=True, sizes=sizes)
    echo.start()
    echo.finish()
    assert "".join(out) == "written before the echo started\n"
