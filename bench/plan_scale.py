"""How planning grows with the job: make_plan() at three sizes of N nodes x 8 GPUs, with the
growth exponent, the largest environment string a rank gets, and the plan's memory.

    python bench/plan_scale.py [--nodes 125,250,1000] [--gpus 8] [--repeat 3]

A linear planner has an exponent near 1.0. Nothing here starts a process: the plan is pure.
"""
import argparse
import math
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fluidctl.planning import plan as planner  # noqa: E402
from fluidctl.planning.config import LaunchConfig  # noqa: E402


def build(n_nodes: int, gpus: int):
    cfg = LaunchConfig(script="train.py", token="t", python="/usr/bin/python3", log_dir="log",
                       backend="ssh")
    nodes = [planner.remote_node(f"n{i}", f"198.18.{i // 250}.{1 + i % 250}", None, None, None,
                                 [str(g) for g in range(gpus)], 0) for i in range(n_nodes)]
    spec = cfg.job(nodes, multi_node_logs=True)
    spec.cores = 96
    ports = {i: list(range(7000, 7001 + gpus)) for i in range(n_nodes)}
    return spec, ports


def measure(n_nodes: int, gpus: int, repeat: int):
    spec, ports = build(n_nodes, gpus)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan = planner.make_plan(spec, ports, backend="ssh")
        times.append(time.perf_counter() - start)
    biggest = max(len(v) for p in plan.procs[:8] for v in p.env.values())
    tracemalloc.start()
    plan = planner.make_plan(spec, ports, backend="ssh")
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return statistics.median(times), biggest, held, len(plan.procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="125,250,1000")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--record", action="store_true",
                    help="write the largest size's row to bench/results.json")
    args = ap.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    rows, biggest_at = [], 0
    print(f"{'nodes x gpus':>14} {'ranks':>7} {'make_plan s':>12} {'largest env str':>16} "
          f"{'plan MiB':>9}")
    for n in sizes:
        t, biggest, held, ranks = measure(n, args.gpus, args.repeat)
        rows.append((ranks, t))
        biggest_at = max(biggest_at, biggest)
        print(f"{n:>8} x {args.gpus:<3} {ranks:>7} {t:>12.3f} {biggest:>16,} {held / 2**20:>9.1f}")
    (r0, t0), (r1, t1) = rows[0], rows[-1]
    exponent = math.log(t1 / t0) / math.log(r1 / r0)
    print(f"growth exponent {exponent:.2f} "
          f"(time ~ ranks^k from {r0} to {r1} ranks; 1.0 is linear)")
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import results
        results.record("plan-scale", what=f"make_plan, {sizes[-1]:,} nodes x {args.gpus} GPUs "
                                          f"({r1:,} ranks)",
                       fluidctl=f"{t1:.2f} s; growth exponent {exponent:.2f} over "
                                f"{r0:,}-{r1:,} ranks; largest env string "
                                f"{biggest_at / 1024:.1f} KiB at any size (bound 64 KiB)",
                       peer="-", ratio="-", machine="2 cores",
                       command=f"python bench/plan_scale.py --nodes {args.nodes} "
                               f"--gpus {args.gpus} --repeat {args.repeat} --record")


if __name__ == "__main__":
    main()
