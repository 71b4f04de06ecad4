"""Start-up time of a 2-node, 4-rank no-op job: fluidctl over SSH vs mpirun over the same hosts.

    python bench/multinode_startup.py [--repeat 7]

Starts two real sshd servers on 127.0.0.2 and 127.0.0.3 (tests/sshd.py, the same fixture the
tests use), then, round by round in one run: `fluidctl train --hostfile H` (ssh backend, node
check included), `fluidctl train --backend fabric`, and `mpirun -np 4 --hostfile H python noop.py`
(OpenMPI's own ssh launcher, same ssh config). Prints medians and the ratio fluidctl / mpirun.
"""
import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshd import SSHNodes  # noqa: E402
from wallclock import interleaved, report, timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    why_not = SSHNodes.available()
    if why_not:
        raise SystemExit(why_not)
    work = Path(tempfile.mkdtemp(prefix="fluidctl-bench-mn-"))
    nodes = SSHNodes.start(work / "sshd")
    try:
        hosts = nodes.hostfile("hosts", slots=2)
        noop = work / "noop.py"
        noop.write_text("pass\n")
        fluid = [sys.executable, "-m", "fluidctl", "train", "--hostfile", str(hosts),
                 "--ssh-config", str(nodes.config), "--tee", "none"]
        from fluidctl.backends.mpi import launcher as mpi
        mpirun = mpi.command([sys.executable, str(noop)], 4, hosts=_hosts(hosts),
                             hostfile=str(hosts), ssh_config=str(nodes.config))
        runners = {
            "fluidctl ssh": lambda: timed(fluid + [str(noop)], work),
            "fluidctl fabric": lambda: timed(fluid + ["--backend", "fabric", str(noop)], work),
            "mpirun": lambda: timed(mpirun, work, dict(os.environ, OMPI_MCA_btl="tcp,self")),
        }
        times = interleaved(runners, args.repeat)
    finally:
        nodes.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = report(f"2 nodes x 2 ranks, no-op script, median of {args.repeat} runs", times)
    for name in ("fluidctl ssh", "fluidctl fabric"):
        print(f"{name} / mpirun = {med[name] / med['mpirun']:.2f}x  (goal <= 1.0x)")


def _hosts(path):
    from fluidctl.planning.hosts import parse_hostfile
    return parse_hostfile(path)


if __name__ == "__main__":
    main()
