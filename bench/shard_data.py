"""Benchmark: `fluidctl shard-data` against GNU `split -n l/N` in the same run.

Generates a line file (default 1 GiB) in /tmp, then alternates runs of split and of each
fluidctl variant, printing median wall times, the ratio to split, and fluidctl's peak RSS
(from wait4's rusage of that very child). The file and outputs are deleted at the end.

    python bench/shard_data.py                 # 1 GiB, 4 shards, 5 runs each
    python bench/shard_data.py --size-mib 256 --runs 3
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "lines (sha256)": [],
    "lines --checksum none": ["--checksum", "none"],
    "lines --equalize pad": ["--equalize", "pad"],
    "lines --equalize pad --checksum none": ["--equalize", "pad", "--checksum", "none"],
    "lines --shuffle": ["--shuffle", "--seed", "1"],
}


def make_file(path: str, size: int) -> int:
    """Text lines of 5-30 words, like a tokenised corpus."""
    rng = random.Random(1)
    words = [f"w{i}".encode() for i in range(5000)]
    block = b"".join(b" ".join(rng.choices(words, k=rng.randint(5, 30))) + b"\n"
                     for _ in range(20000))
    written = 0
    with open(path, "wb") as f:
        while written < size:
            f.write(block)
            written += len(block)
    return written


def run(argv) -> tuple:
    """Wall seconds and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench: {argv[:3]} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", action="append", choices=sorted(VARIANTS),
                        help="run only these fluidctl variants (repeatable)")
    args = parser.parse_args()
    if not shutil.which("split"):
        sys.exit("bench: GNU split not found")
    work = tempfile.mkdtemp(prefix="fluidctl-bench-", dir="/tmp")
    try:
        data = os.path.join(work, "train.txt")
        size = make_file(data, args.size_mib << 20)
        print(f"input: {size / 2**30:.2f} GiB, {args.trainers} shards, {args.runs} runs each, "
              f"{os.cpu_count()} cores", flush=True)
        fluidctl = [sys.executable, "-m", "fluidctl", "shard-data", data, "-n",
                    str(args.trainers), "-q", "--force"]
        variants = {k: v for k, v in VARIANTS.items() if not args.only or k in args.only}
        times = {"split -n l/%d" % args.trainers: []}
        rss = {}
        times.update({k: [] for k in variants})
        for _ in range(args.runs):
            out = os.path.join(work, "split")
            shutil.rmtree(out, ignore_errors=True)
            os.mkdir(out)
            wall, _ = run(["split", "-n", f"l/{args.trainers}", data, out + "/x"])
            times["split -n l/%d" % args.trainers].append(wall)
            shutil.rmtree(out)
            for label, extra in variants.items():
                out = os.path.join(work, "shards")
                wall, peak = run(fluidctl + ["-o", out] + extra)
                times[label].append(wall)
                rss[label] = max(rss.get(label, 0), peak)
                shutil.rmtree(out)
        base = statistics.median(times["split -n l/%d" % args.trainers])
        print(f"{'command':38s} {'median s':>9s} {'min s':>7s} {'x split':>8s} {'peak RSS':>9s}")
        for label, values in times.items():
            med = statistics.median(values)
            peak = f"{rss[label]:.0f} MiB" if label in rss else "-"
            print(f"{label:38s} {med:9.3f} {min(values):7.3f} {med / base:8.2f} {peak:>9s}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
