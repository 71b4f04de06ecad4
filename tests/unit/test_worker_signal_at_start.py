"""``fluidctl worker`` (no mpirun, no srun) forwards a signal that comes while its child is
being started: the child gets it once it exists, and the worker lives to report its end."""
import subprocess
import sys

CHILD_GETS_TERM_DURING_START = r"""
import os, signal, subprocess, sys
from fluidctl.node import worker
real = subprocess.Popen

def popen_after_a_signal(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)     # comes before the child exists
    for _ in range(3):                        # Python runs the handler between bytecodes
        pass
    return real(*args, **kwargs)

subprocess.Popen = popen_after_a_signal
code = worker.run_child([sys.executable, "-c", "import time; time.sleep(60)"],
                        dict(os.environ), None)
print("child ended with", code, flush=True)
"""


def test_a_signal_while_the_child_starts_reaches_the_child(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD_GETS_TERM_DURING_START], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    # before: the worker itself died of the SIGTERM (-15) and its child slept on, alone
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.strip() == "child ended with 143"
