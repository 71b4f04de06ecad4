"""Benchmark: reading throughput of ShardReader over canonical shards (shard-data --shards N:
rank 0 of 4 reads its quarter of the epoch's global order, record by record) beside the same
reader over per-trainer shards (shard-data --trainers 4: rank 0 streams its own file), on the
same data in the same run.

It writes a text file of short records in a temporary directory, shards it both ways, reads one
untimed epoch of each (the page cache warm), then alternates timed epochs of the two, and prints
the median records per second of each, their ratio, and the median CPU microseconds per record
(the figure that holds on a busy machine). Files are deleted at the end.

    python bench/shard_reader.py                          # 1,000,000 records, 5 rounds
    python bench/shard_reader.py --records 200000 --shards 16 --runs 3
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from fluidctl import sharding
from fluidctl.runtime.data import ShardReader


def epoch_rate(directory: str, batch: int, world: int, **canonical) -> tuple:
    """(records per wall second, CPU microseconds per record) of one epoch of rank 0."""
    start, cpu = time.perf_counter(), time.process_time()
    count = sum(len(b) for b in ShardReader(directory, batch, rank=0, world=world, **canonical))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - start
    return count / wall, cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=16, help="canonical shards")
    parser.add_argument("--world", type=int, default=4, help="ranks; rank 0 is timed")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="fluidctl-bench-reader-")
    try:
        src = os.path.join(work, "train.txt")
        with open(src, "w") as f:
            f.writelines(f"sample-{i} {'x' * (i * 7 % 50)}\n" for i in range(args.records))
        per_trainer, canonical = os.path.join(work, "per"), os.path.join(work, "canon")
        sharding.shard(sharding.ShardOptions([src], args.world, per_trainer))
        sharding.shard(sharding.ShardOptions([src], args.shards, canonical, canonical=True))
        contenders = {
            f"canonical ({args.shards} shards, seed 1)":
                lambda: epoch_rate(canonical, args.batch, args.world, seed=1),
            f"per-trainer ({args.world} shards)":
                lambda: epoch_rate(per_trainer, args.batch, args.world),
        }
        for run in contenders.values():
            run()                                               # warm the page cache
        rates = {name: [] for name in contenders}
        for _ in range(args.runs):
            for name, run in contenders.items():
                rates[name].append(run())
        size = os.path.getsize(src)
        print(f"{args.records:,} records ({size / 2**20:.1f} MiB), rank 0 of {args.world}, "
              f"batch {args.batch}, {args.runs} rounds: median records/s, CPU us/record")
        medians = {name: (statistics.median(r[0] for r in runs),
                          statistics.median(r[1] for r in runs)) for name, runs in rates.items()}
        base = list(medians.values())[1][0]
        for name, (rate, cpu) in medians.items():
            print(f"  {name:<32} {rate:>12,.0f}  {rate / base:.3f}x per-trainer  {cpu:.2f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
