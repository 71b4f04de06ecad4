"""Slurm start-up: fluidctl's Slurm backend vs bare srun / sbatch on a real Slurm.

    python bench/slurm_startup.py [--repeat 7]

Starts the test cluster of tests/slurm.py (munged, slurmctld, two slurmd on 127.0.0.2/3), then,
round by round in one run:

1. inside one allocation (2 nodes x 2 tasks): `fluidctl train --backend slurm noop.py` vs
   `srun -N2 --ntasks-per-node=2 python noop.py`, whole command to its end; beside them the
   floor of any Python launcher on this machine: `python -c` that only runs srun and waits,
   each task `python -m fluidctl worker noop.py` (and that srun alone);
2. from outside: submit-to-first-rank latency, from just before the command to the moment the
   first rank starts (each rank writes its start time), of `fluidctl train --backend slurm
   --nodes 2 --nproc 2 --detach stamp.py` vs `sbatch` of a bare script whose body is
   `srun python stamp.py`. Each job is waited for before the next round.

Prints medians and the ratios (goal for 1: <= 1.2x srun).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from slurm import SlurmCluster  # noqa: E402
from wallclock import interleaved, report, timed  # noqa: E402

STAMP = """
import os, sys, time
t = time.time()
path = os.path.join(sys.argv[1], f"stamp.{os.environ.get('SLURM_PROCID', '0')}")
with open(path + ".tmp", "w") as f:
    f.write(repr(t))
os.replace(path + ".tmp", path)
"""


PYTHON_FLOOR = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def first_rank_latency(cmd, cwd, env, stamps: Path, cluster: SlurmCluster) -> float:
    """Seconds from submitting to the first rank's start; then wait for the job to end."""
    for old in stamps.glob("stamp.*"):
        old.unlink()
    start = time.time()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{cmd[0]} failed: {res.stderr[-2000:]}")
    while len(list(stamps.glob("stamp.?"))) < 4:
        time.sleep(0.005)
    first = min(float(p.read_text()) for p in stamps.glob("stamp.?"))
    job_id = res.stdout.strip() or res.stderr.split("submitted Slurm job ")[1].split()[0]
    cluster.wait_gone(job_id.split(";")[0])
    cluster.wait_idle()
    return first - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    why_not = SlurmCluster.available()
    if why_not:
        raise SystemExit(why_not)
    work = Path(tempfile.mkdtemp(prefix="fluidctl-bench-slurm-"))
    cluster = SlurmCluster.start(work / "slurm")
    try:
        noop = work / "noop.py"
        noop.write_text("pass\n")
        stamp = work / "stamp.py"
        stamp.write_text(STAMP)
        stamps = work / "stamps"
        stamps.mkdir()
        alloc = cluster.env(**cluster.allocate(2, 2), FLUIDCTL_STATE_DIR=str(work / "state"))
        outside = cluster.env(FLUIDCTL_STATE_DIR=str(work / "state"))
        fluid = [sys.executable, "-m", "fluidctl", "train", "--backend", "slurm"]
        bare = work / "bare.sbatch"
        bare.write_text(f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
                        f"#SBATCH --output={work}/bare-%j.out\n"
                        f"srun {sys.executable} {stamp} {stamps}\n")
        # the floor of any Python launcher here: an interpreter that starts srun and waits,
        # with each task's `fluidctl worker` (the environment contract) as fluidctl runs it
        from fluidctl.backends.slurm.plan import step_env
        step = ["srun", "-N2", "--ntasks-per-node=2"]
        worker = [sys.executable, "-m", "fluidctl", "worker", str(noop)]
        worker_env = {**alloc, **step_env(log_dir=work / "log-floor", token="0" * 32,
                                          user_env={})}
        (work / "log-floor").mkdir()
        inside = interleaved({
            "fluidctl --backend slurm": lambda: timed(
                fluid + ["--tee", "none", "--log-dir", str(work / "log-in"), str(noop)], work,
                alloc),
            "srun": lambda: timed(step + [sys.executable, str(noop)], work, alloc),
            "srun + fluidctl worker": lambda: timed(step + worker, work, worker_env),
            "python + srun + fluidctl worker": lambda: timed(
                [sys.executable, "-c", PYTHON_FLOOR] + step + worker, work, worker_env),
        }, args.repeat)
        cluster.cancel_all()
        cluster.wait_idle()
        submit = interleaved({
            "fluidctl sbatch": lambda: first_rank_latency(
                fluid + ["--nodes", "2", "--nproc", "2", "--detach", "--log-dir",
                         str(work / "log-out"), str(stamp), str(stamps)], work, outside, stamps,
                cluster),
            "bare sbatch": lambda: first_rank_latency(
                ["sbatch", "--parsable", str(bare)], work, outside, stamps, cluster),
        }, args.repeat)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = report(f"inside an allocation: 2 nodes x 2 ranks, no-op, median of {args.repeat}",
                 inside)
    print(f"fluidctl / srun = {med['fluidctl --backend slurm'] / med['srun']:.2f}x "
          f"(goal <= 1.2x)")
    floor = med["python + srun + fluidctl worker"]
    print(f"floor of a Python launcher / srun = {floor / med['srun']:.2f}x "
          f"(the worker alone: {med['srun + fluidctl worker'] / med['srun']:.2f}x); "
          f"fluidctl / floor = {med['fluidctl --backend slurm'] / floor:.2f}x")
    med = report(f"submit to first rank, 2 nodes x 2 ranks, median of {args.repeat}", submit)
    print(f"fluidctl sbatch / bare sbatch = {med['fluidctl sbatch'] / med['bare sbatch']:.2f}x")


if __name__ == "__main__":
    os.environ.pop("SLURM_JOB_ID", None)
    main()
