"""Benchmark: `fluidctl shard-data` against GNU `split -n l/N` in the same run, and its start-up
against `python -c pass`.

For each size (default 256 MiB and 1 GiB) it generates a line file in /tmp, warms the page
cache with one untimed run of each contender, then runs split and each fluidctl variant round
by round, in a seeded random order per round (a fresh process each time, `-q`; the input read
through the page cache right before each, the previous output deleted and synced), and prints
medians, minimums, the ratio of
medians to split, the median CPU time (user + system) of each contender and fluidctl's peak
RSS (both from wait4's rusage of that very child). Then it
times `python -c pass`, `fluidctl --version` and `fluidctl shard-data` of a 1-line file the same
way. fluidctl's modules are byte-compiled first, as pip does when it installs them (this matters
where PYTHONDONTWRITEBYTECODE is set). Files and outputs are deleted at the end.

    python bench/shard_data.py                      # 256 MiB and 1 GiB, 7 rounds; ~1 minute
    python bench/shard_data.py --sizes 1024 --runs 5 --only default --only "--checksum sha256"
    python bench/shard_data.py --variants all      # adds pad, none, shuffle (slow)
    python bench/shard_data.py --venv /tmp/fluidctl-venv   # fluidctl as pip installs it
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

import installed

VARIANTS = {                     # label -> extra arguments
    "default": [],
    "--checksum blake3": ["--checksum", "blake3"],
    "--checksum sha256": ["--checksum", "sha256"],
    "--checksum none": ["--checksum", "none"],
    "--equalize pad": ["--equalize", "pad"],
    "--shuffle": ["--shuffle", "--seed", "1"],
}
QUICK = ["default", "--checksum blake3", "--checksum sha256"]


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


CPU: dict = {}                   # label -> CPU seconds (user + system) of each run


def run(argv, label: str = "") -> tuple:
    """Wall seconds and peak RSS (MiB) of one child process; its CPU time goes to CPU[label]."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"bench: {argv[:4]} failed with exit code {code}")
    if label:
        CPU.setdefault(label, []).append(usage.ru_utime + usage.ru_stime)
    return wall, usage.ru_maxrss / 1024


def table(title: str, times: dict, base_label: str, rss: dict) -> dict:
    """Wall medians and their ratio; beside them the median CPU seconds (user + system) of
    each contender, which a loaded machine disturbs far less than wall time."""
    base = statistics.median(times[base_label])
    print(title)
    print(f"  {'command':34s} {'median s':>9s} {'min s':>7s} {'ratio':>6s} {'CPU s':>7s} "
          f"{'peak RSS':>9s}")
    for label, values in times.items():
        med = statistics.median(values)
        peak = f"{rss[label]:.0f} MiB" if label in rss else "-"
        cpu = statistics.median(CPU[label]) if CPU.get(label) else float("nan")
        print(f"  {label:34s} {med:9.3f} {min(values):7.3f} {med / base:6.2f} {cpu:7.3f} "
              f"{peak:>9s}")
    print(flush=True)
    return {label: statistics.median(values) for label, values in times.items()}


def record(args, row_id: str, what: str, med: dict, label: str, base: str, peer: str) -> None:
    """--record: this row of bench/results.json (docs/performance.md) from these medians."""
    if not args.record or label not in med:
        return
    from results import record as write
    command = f"python bench/shard_data.py --runs {args.runs} --startup-runs {args.startup_runs}"
    write(row_id, what=what, fluidctl=f"{med[label]:.3f} s", peer=f"{peer} {med[base]:.3f} s",
          ratio=f"{med[label] / med[base]:.2f}x", command=command)


def bench_size(work: str, mib: int, args, variants: dict, fluidctl_cmd: list) -> None:
    data = os.path.join(work, f"train-{mib}.txt")
    size = make_file(data, mib << 20)
    split_label = f"split -n l/{args.trainers}"
    times = {split_label: [], **{f"fluidctl {k}": [] for k in variants}}
    rss: dict = {}
    out = os.path.join(work, "out")

    def clean():
        """Remove the last output and write back what is dirty, so no contender pays for the
        previous one's writeback."""
        shutil.rmtree(out)
        os.sync()

    def warm():
        """Read the input through the page cache right before each timed run. "Warm cache" is
        not a given here: this machine runs DAMON with a pageout scheme that drops page-cache
        pages it finds cold, and whoever ran after that re-read the input from disk (2-3x the
        CPU, the penalty moving with the slot when the order changed)."""
        buf = bytearray(1 << 20)
        with open(data, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    def one_split(label=""):
        os.mkdir(out)
        warm()
        wall, _ = run(["split", "-n", f"l/{args.trainers}", data, out + "/x"], label)
        clean()
        return wall

    def one_fluidctl(extra, label=""):
        warm()
        wall, peak = run(fluidctl_cmd + [data, "-n", str(args.trainers), "-o", out, "-q"] + extra,
                         label)
        clean()
        return wall, peak

    os.sync()
    one_split()                                   # warm the page cache, untimed
    for extra in variants.values():
        one_fluidctl(extra)
    CPU.clear()
    # Each round runs the contenders in a fresh random order (seeded): on this machine the run
    # right after split's was slower whoever it was (sys time 2-3x, something in the kernel's
    # handling of the GiB just written and deleted), so a fixed order charged one contender.
    order = random.Random(len(variants) * 1000 + mib)
    contenders = [None, *variants]
    for _ in range(args.runs):
        order.shuffle(contenders)
        for label in contenders:
            if label is None:
                times[split_label].append(one_split(split_label))
                continue
            wall, peak = one_fluidctl(variants[label], f"fluidctl {label}")
            times[f"fluidctl {label}"].append(wall)
            rss[f"fluidctl {label}"] = max(rss.get(f"fluidctl {label}", 0), peak)
    os.unlink(data)
    med = table(f"{size / 2**20:.0f} MiB into {args.trainers} shards, {args.runs} interleaved "
                f"rounds (ratio: median / split's median)", times, split_label, rss)
    if args.trainers == 4 and mib in (256, 1024) and not args.venv:
        name = "256 MiB" if mib == 256 else "1 GiB"
        record(args, "shard-256m" if mib == 256 else "shard-1g",
               f"shard-data, {name} into 4 shards" + (" (xxh3-128 per shard)" if mib == 256 else ""),
               med, "fluidctl default", split_label, "split -n l/4")


def bench_startup(work: str, args, fluidctl_cmd: list) -> None:
    tiny = os.path.join(work, "tiny.txt")
    with open(tiny, "w") as f:
        f.write("one record\n")
    out = os.path.join(work, "tiny-out")
    contenders = {
        "python -c pass": [installed.python(fluidctl_cmd[:-1]), "-c", "pass"],
        "fluidctl --version": fluidctl_cmd[:-1] + ["--version"],
        "fluidctl shard-data (1 line, -q)": fluidctl_cmd + [tiny, "-n", "1", "-o", out, "-q",
                                                              "--force"],
        "fluidctl shard-data (1 line)": fluidctl_cmd + [tiny, "-n", "1", "-o", out, "--force"],
    }
    times = {k: [] for k in contenders}
    CPU.clear()
    for _ in range(args.startup_runs):
        for label, argv in contenders.items():
            times[label].append(run(argv, label)[0])
    med = table(f"start-up, {args.startup_runs} interleaved rounds (ratio: median / python -c "
                "pass)", times, "python -c pass", {})
    if not args.venv:
        record(args, "startup", "start-up: fluidctl --version", med, "fluidctl --version",
               "python -c pass", "python -c pass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], metavar="MIB")
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--startup-runs", type=int, default=21)
    parser.add_argument("--variants", choices=["quick", "all"], default="quick")
    parser.add_argument("--only", action="append", choices=sorted(VARIANTS),
                        help="run only these fluidctl variants (repeatable)")
    parser.add_argument("--record", action="store_true",
                        help="write the figures into bench/results.json (docs/performance.md)")
    installed.add_option(parser)
    args = parser.parse_args()
    if not shutil.which("split"):
        sys.exit("bench: GNU split not found")
    names = args.only or (QUICK if args.variants == "quick" else list(VARIANTS))
    variants = {k: VARIANTS[k] for k in names}
    fluidctl_cmd = installed.fluidctl_argv(args.venv) + ["shard-data"]
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.2f} at the start; "
          f"{installed.describe(fluidctl_cmd[:-1])}\n", flush=True)
    work = tempfile.mkdtemp(prefix="fluidctl-bench-", dir="/tmp")
    try:
        for mib in args.sizes:
            bench_size(work, mib, args, variants, fluidctl_cmd)
        bench_startup(work, args, fluidctl_cmd)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
