"""Wall time to launch and finish a 4-process no-op job: fluidctl vs bare python vs torchrun.

    python bench/launch_overhead.py [--nproc 4] [--repeat 9]

All three run in the same invocation, interleaved round by round so machine noise hits them
alike; medians and ratios are printed. torchrun is skipped when torch is not installed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from wallclock import interleaved, report, timed


def bare(nproc, script, cwd):
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-u", script], cwd=cwd) for _ in range(nproc)]
    for p in procs:
        if p.wait():
            raise RuntimeError("bare python failed")
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--record", action="store_true",
                    help="write the figures into bench/results.json (docs/performance.md)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fluidctl-bench-")
    script = os.path.join(work, "noop.py")
    with open(script, "w") as f:
        f.write("pass\n")
    fluid = shutil.which("fluidctl")
    runners = {
        "bare python x N": lambda: bare(args.nproc, script, work),
        "fluidctl train": lambda: timed([fluid, "train", "--nproc", str(args.nproc), "--tee",
                                         "none", script], work),
    }
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        str(args.nproc), "--master-port", "0", script]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            runners["torchrun"] = lambda: timed(torchrun, work, env)
        times = interleaved(runners, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = report(f"launch of a {args.nproc}-process no-op job, median of {args.repeat} runs",
                 times)
    f = med["fluidctl train"]
    print(f"fluidctl / bare python = {f / med['bare python x N']:.2f}x")
    if "torchrun" in med:
        print(f"fluidctl / torchrun    = {f / med['torchrun']:.2f}x  (goal <= 0.25x)")
    if args.record and "torchrun" in med:
        from results import record
        record("launch", what=f"{args.nproc}-process no-op job, start to end",
               fluidctl=f"{f:.3f} s", peer=f"torchrun {med['torchrun']:.3f} s",
               ratio=f"{f / med['torchrun']:.2f}x",
               command=f"python bench/launch_overhead.py --repeat {args.repeat}")


if __name__ == "__main__":
    main()
