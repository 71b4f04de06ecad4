"""An MPIJob Launcher's entry (``python3 -m fluidctl.backends.k8s.mpilaunch MPIRUN ARGV``, the
command ``render.py`` writes; users never type it): mpirun, with an exit status that says
whether the job ran to its end.

Open MPI 5's prterun can exit 0 after losing a Worker's daemon (the Worker pod was killed): it
terminates every rank and reports success, so the Launcher's Job would count the job as
succeeded and never restart it. This runs mpirun, passes its output through, forwards SIGTERM
and SIGINT to it (the kubelet's stop, a checkpoint request), and exits 1 when mpirun said it
lost a daemon, else with mpirun's own status.
"""
from __future__ import annotations

import signal
import subprocess
import sys

LOST = "has lost communication with a remote daemon"     # ORTE's and PRTE's words
NOT_BY_HAND = "the Launcher's entry is written by fluidctl train --backend k8s --kind mpijob"


def run(argv, out=None) -> int:
    out = out or sys.stdout.buffer
    from fluidctl.procs import mpisessions
    mpisessions.sweep()     # a killed mpirun's, in a Launcher pod that restarted in place
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    lost = False
    for line in iter(proc.stdout.readline, b""):
        out.write(line)
        out.flush()
        lost = lost or LOST in line.decode("utf-8", "replace")
    code = proc.wait()
    if code == 0 and lost:
        out.write(b"fluidctl: mpirun lost a Worker's daemon and exited 0; the Launcher fails "
                  b"so that its Job restarts the job\n")
        out.flush()
        return 1
    return code if code >= 0 else 128 - code


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(f"error: usage: python -m fluidctl.backends.k8s.mpilaunch MPIRUN [ARGS...] "
              f"({NOT_BY_HAND})", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
