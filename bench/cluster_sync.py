"""Benchmark: `fluidctl cluster sync` against `rsync -a` over the same two loopback sshd nodes.

Starts two real OpenSSH servers (127.0.0.2 and 127.0.0.3, as the tests do), builds a workspace
of many small files and a few large ones, and times, round by round, interleaved:

* first copy: into empty remote directories (removed after each run);
* incremental: after one file was modified (new content, new mtime), into directories that
  already hold the previous state.

The peers are `rsync -a -e "ssh -F CONFIG"` to both nodes at once (two processes, as fast as a
user can drive rsync) and one after the other (the plain shell loop). fluidctl syncs both
nodes at once in one command. Prints medians, minimums, the ratio of medians to rsync, and the
median CPU seconds of both ends (local processes and the sshd sessions' whole trees).
rsync must be installed here and on the nodes (the nodes are this machine); fluidctl needs
neither. Everything is deleted at the end.

    python bench/cluster_sync.py                  # ~1 minute
    python bench/cluster_sync.py --small 3000 --large-mib 64 --runs 9
    python bench/cluster_sync.py --venv /tmp/fluidctl-venv   # fluidctl as pip installs it
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import installed  # noqa: E402
from sshd import SSHNodes  # noqa: E402


def make_workspace(root: Path, small: int, large_mib: int, large_files: int) -> int:
    """``small`` source-like files (200 B - 16 KiB) in nested directories, and ``large_files``
    files of ``large_mib`` MiB together (checkpoints, data)."""
    rng = random.Random(7)
    total = 0
    for i in range(small):
        d = root / f"pkg{i % 40}" / f"mod{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        data = bytes(rng.getrandbits(8) for _ in range(64)) * rng.randint(3, 256)
        (d / f"file{i}.py").write_bytes(data)
        total += len(data)
    for i in range(large_files):
        size = (large_mib << 20) // large_files
        with open(root / f"weights{i}.bin", "wb") as f:
            f.write(os.urandom(size))
        total += size
    return total


HZ = os.sysconf("SC_CLK_TCK")


def cpu_now(nodes) -> float:
    """CPU seconds (user + system) used so far by this process's finished children (fluidctl,
    rsync, ssh) plus the sshd daemons' finished children (the sessions, the remote receiver or
    rsync): both ends of every transfer, less disturbed by a loaded machine than wall time."""
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime
    for node in nodes.nodes.values():
        with open(f"/proc/{node.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / HZ      # cutime, cstime
    return total


def timed(argv, env=None) -> float:
    start = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    wall = time.perf_counter() - start
    if res.returncode:
        sys.exit(f"bench: {' '.join(map(str, argv[:6]))} ... failed ({res.returncode}): "
                 f"{res.stderr[-2000:]}")
    return wall


def timed_parallel(argvs) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for a in argvs]
    for proc, argv in zip(procs, argvs):
        _, err = proc.communicate()
        if proc.returncode:
            sys.exit(f"bench: {argv[:4]} failed: {err[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="small files (default 2000)")
    parser.add_argument("--large-mib", type=int, default=48, help="MiB of large files")
    parser.add_argument("--large-files", type=int, default=3)
    parser.add_argument("--runs", type=int, default=7)
    installed.add_option(parser)
    args = parser.parse_args()
    if not shutil.which("rsync"):
        sys.exit("bench: rsync not found (apt-get install rsync): it is the peer")
    reason = SSHNodes.available()
    if reason:
        sys.exit(f"bench: {reason}")
    fluidctl = installed.fluidctl_argv(args.venv)
    work = Path(tempfile.mkdtemp(prefix="fluidctl-syncbench-", dir="/tmp"))
    nodes = SSHNodes.start(work / "sshd")
    try:
        ws = work / "ws"
        ws.mkdir()
        total = make_workspace(ws, args.small, args.large_mib, args.large_files)
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; workspace: "
              f"{args.small} small files + {args.large_files} large, {total / 2**20:.1f} MiB; "
              f"2 nodes; {args.runs} interleaved rounds; {installed.describe(fluidctl)}\n",
              flush=True)
        config = str(nodes.config)
        aliases = nodes.aliases
        fluidctl_cmd = [*fluidctl, "cluster", "sync", "--hosts",
                        ",".join(aliases), "--ssh-config", config]

        def dest(kind, alias):
            return work / "remote" / kind / alias

        def rsync(kind, alias):
            return ["rsync", "-a", "-e", f"ssh -F {config}", f"{ws}/",
                    f"{alias}:{dest(kind, alias)}/"]

        def fl(kind):
            return fluidctl_cmd + ["--remote-dir", str(work / "remote" / kind / "{host}"),
                                   str(ws)]

        def clear(kind):
            shutil.rmtree(work / "remote" / kind, ignore_errors=True)
            for alias in aliases:       # rsync wants the parent there
                dest(kind, alias).parent.mkdir(parents=True, exist_ok=True)

        contenders = {
            "fluidctl cluster sync (2 nodes)": lambda k: timed(fl(k)),
            "rsync -a, 2 nodes in parallel": lambda k: timed_parallel([rsync(k, a) for a in aliases]),
            "rsync -a, one node after the other": lambda k: sum(timed(rsync(k, a)) for a in aliases),
        }
        kinds = {name: f"c{i}" for i, name in enumerate(contenders)}
        first = {name: [] for name in contenders}
        incr = {name: [] for name in contenders}
        cpu = {"first": {name: [] for name in contenders},
               "incr": {name: [] for name in contenders}}

        def measured(kind, name, run):
            before = cpu_now(nodes)
            wall = run(kinds[name])
            cpu[kind][name].append(cpu_now(nodes) - before)
            return wall
        for name, run in contenders.items():          # warm-up: caches, sshd, imports
            clear(kinds[name])
            run(kinds[name])
        touched = ws / "pkg3" / "mod3" / "file3.py"
        for r in range(args.runs):
            for name, run in contenders.items():
                clear(kinds[name])
                first[name].append(measured("first", name, run))
            for name, run in contenders.items():
                run(kinds[name])                         # in step with the workspace
            touched.write_bytes(touched.read_bytes() + b"# edit %d\n" % r)
            for name, run in contenders.items():
                incr[name].append(measured("incr", name, run))
        for title, times, kind in (("first copy", first, "first"),
                                   ("incremental, one file modified", incr, "incr")):
            base = statistics.median(times["rsync -a, 2 nodes in parallel"])
            print(title)
            print(f"  {'command':38s} {'median s':>9s} {'min s':>7s} {'ratio':>6s} "
                  f"{'CPU s':>7s}")
            for name, values in times.items():
                med = statistics.median(values)
                print(f"  {name:38s} {med:9.3f} {min(values):7.3f} {med / base:6.2f} "
                      f"{statistics.median(cpu[kind][name]):7.3f}")
            print("  (ratio: median / the median of rsync to 2 nodes in parallel; CPU s: both "
                  "ends, sshd sessions included)\n")
        for alias in aliases:                            # same bytes arrived
            diff = subprocess.run(["diff", "-r", "-q", str(ws), str(dest(kinds[next(iter(
                contenders))], alias))], capture_output=True, text=True)
            if diff.returncode:
                sys.exit(f"bench: fluidctl's copy on {alias} differs: {diff.stdout[:500]}")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
    finally:
        nodes.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
