"""Per-collective metadata cost against the world size: 1,000 / 8,000 / 96,000 simulated ranks.

    python bench/meta_scale.py [--calls 200000]

A GPU collective agrees on its metadata in full on a signature's first use, then folds it into
a rolling hash that the ranks compare about every 50 ms (agree.py). This bench drives the real
CallLog with a simulated transport: every exchange it asks for gathers a table of N identical
records (what every rank would hold) and runs meta.check on it, or, for a hash comparison,
reduces 4 numbers. It prints, per world size:

- hash phase: the metadata cost per call, averaged over ``--calls`` calls (the first use and
  every comparison included): flat in N;
- full check: one call agreed in full on the N-row table (first use, or
  FLUIDCTL_STRICT_COLLECTIVES=1): one numpy comparison;
- per-row check: the same table through meta.check's Python loop over the ranks (what every
  call paid before, and what a mismatching table still pays to be named).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from fluidctl.runtime.collective import meta  # noqa: E402
from fluidctl.runtime.collective.agree import CallLog, signature  # noqa: E402


class SimulatedWorld:
    """What CallLog needs of a Communicator, for N ranks that all make the same calls."""

    def __init__(self, n: int):
        self.rank, self.world_size, self.nccl, self._seq = 0, n, None, 0
        self.exchanges = 0

    def _exchange(self, flat, rec, op, zero_input) -> None:
        self.exchanges += 1
        if rec[meta.KIND] == meta.CHECK:      # a 4-number allreduce: every rank sent the same
            return
        table = np.empty((self.world_size, meta.RECORD), np.int64)
        table[:] = rec
        message = meta.check(table)
        if message:
            raise meta.CollectiveError(message)


def per_call(n: int, calls: int) -> float:
    world = SimulatedWorld(n)
    log = CallLog(world, strict=False)
    rec = meta.record(0, "allreduce", "sum", np.float32, (1024,))
    key, sig = ("allreduce", "sum", np.dtype(np.float32), (1024,), 0), signature(rec)
    start = time.perf_counter()
    for _ in range(calls):
        log.call(key, rec, sig)
    return (time.perf_counter() - start) / calls


def best(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200000, help="calls per world size")
    ap.add_argument("--sizes", default="1000,8000,96000", help="simulated world sizes")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("metadata cost per collective (table checks: best of 5 runs)")
    print("| ranks | hash phase, per call | full check (numpy) | per-row check (Python) |")
    print("|---|---|---|---|")
    rows = []
    for n in sizes:
        table = np.empty((n, meta.RECORD), np.int64)
        table[:] = meta.record(7, "allreduce", "sum", np.float32, (1024,))
        hashed = per_call(n, args.calls)
        full = best(lambda: meta.check(table))
        loop = best(lambda: meta._first_mismatch(table, True), reps=1 if n > 10000 else 3)
        rows.append((n, hashed, full, loop))
        print(f"| {n:,} | {hashed * 1e6:.2f} us | {full * 1e6:.0f} us | {loop * 1e3:.1f} ms |")
    (n0, h0, _, _), (n1, h1, _, _) = rows[0], rows[-1]
    growth = math.log(h1 / h0) / math.log(n1 / n0)
    print(f"hash phase growth exponent {n0:,} -> {n1:,} ranks: {growth:.2f} (0: flat)")


if __name__ == "__main__":
    main()
