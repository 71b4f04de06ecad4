"""A rank that is stopped (SIGSTOP, a debugger, a frozen cgroup's task moved out) gets SIGCONT
right after SIGTERM, as systemd sends it: a stopped process keeps SIGTERM pending and would sit
out the whole grace period before SIGKILL; woken, it ends on SIGTERM at once (or runs its
handler: a checkpoint)."""
import os
import signal
import sys
import time

import psutil

from fluidctl.procs import local


def _stopped(pid: int, deadline: float = 10.0) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
        time.sleep(0.01)
    return False


def test_terminate_wakes_a_stopped_rank_so_sigterm_ends_it(tmp_path):
    proc = local.LocalProcess("trainer 0", [sys.executable, "-c", "import time; time.sleep(60)"],
                              dict(os.environ), str(tmp_path / "r0.log"))
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        assert _stopped(proc.pid)
        proc.terminate()
        code = proc.popen.wait(timeout=10)      # without SIGCONT: still stopped after 10 s
        assert code == -signal.SIGTERM
    finally:
        proc.kill()
        proc.popen.wait(timeout=10)
        proc.close()


def test_a_stopped_rank_with_a_sigterm_handler_runs_it(tmp_path):
    marker = tmp_path / "saved"
    code = ("import signal, sys, time\n"
            f"def save(*_):\n    open({str(marker)!r}, 'w').write('ok'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, save)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    log = tmp_path / "r0.log"
    proc = local.LocalProcess("trainer 0", [sys.executable, "-c", code], dict(os.environ),
                              str(log))
    try:
        end = time.monotonic() + 20
        while "ready" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)
        assert _stopped(proc.pid)
        proc.terminate()
        assert proc.popen.wait(timeout=10) == 0
        assert marker.read_text() == "ok"
    finally:
        proc.kill()
        proc.popen.wait(timeout=10)
        proc.close()
