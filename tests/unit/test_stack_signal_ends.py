"""Issue 40 item 8: a rank that the stack signal wakes and ends (a sleep in C returns, the
job ends and its diagnostics directory goes) keeps the state it had when the hang was found:
the hang stands, it is not "every rank has exited: not hung"."""
import os
import signal
import subprocess
import sys
import time

from fluidctl.diagnostics.classify import classify
from fluidctl.diagnostics.watch import Target, take_stacks
from fluidctl.paths import DiagDir

# on the stack signal the job ends at once, taking its stack file with it
ENDS_ON_SIGNAL = """
import os, signal, sys, time
path = sys.argv[1]
def end(*_):
    os.unlink(path)
    os._exit(0)
signal.signal(signal.SIGUSR2, end)
open(path + ".ready", "w").close()
time.sleep(600)
"""


def _sleeping(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_40_8_ranks_woken_and_ended_by_the_stack_signal_keep_their_state(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("FLUIDCTL_PYSPY", "")            # the faulthandler signal, not py-spy
    # the ranks' exits are reaped at once, as their supervisor does (no zombie state)
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    diag = DiagDir(tmp_path)
    procs = []
    for rank in (0, 1):
        diag.stack(rank).write_text("")
        procs.append(subprocess.Popen([sys.executable, "-c", ENDS_ON_SIGNAL,
                                       str(diag.stack(rank))]))
    try:
        deadline = time.monotonic() + 30
        while not all(os.path.exists(f"{diag.stack(r)}.ready") and _sleeping(p.pid)
                      for r, p in zip((0, 1), procs)):       # in their sleep, not just ready
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.02)
        dump = take_stacks([Target(r, p.pid, "n", f"trainer {r}") for r, p in
                            zip((0, 1), procs)], diag)
    finally:
        signal.signal(signal.SIGCHLD, previous)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert dump.state == {0: "S", 1: "S"}, (dump.state, dump.why)
    assert dump.signalled == {0: True, 1: True}
    verdict = classify(dump.evidence())
    assert verdict is None or verdict.hung, verdict
