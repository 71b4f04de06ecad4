"""What watching a job costs its launcher: ``fluidctl top`` and ``--metrics-port`` on 64 ranks.

The launcher's extra work is the live publisher (each second: every rank's page, already read
by the straggler watcher, turned into step times; live.json rewritten) and the metrics endpoint
(a snapshot built per scrape). This bench runs exactly that code (``observe.Watching``, as
``fluidctl train`` starts it) in a process of its own, so that its CPU time is the extra and
nothing else, against --ranks pages that another process updates as ranks do (the runtime's
sums, --steps per second each, in /dev/shm; each rank's CPU and memory as node agents report
them), while a real ``fluidctl top --json`` watches the
log dir and a scraper fetches /metrics every --scrape seconds. Prints the process's CPU time
over --seconds as a share of one core (goal: at most 2%), top's own CPU and a scrape's time.

    python bench/observe_cost.py --ranks 64 --seconds 30 [--record]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RANKS_SIM = r"""
import sys, time
from pathlib import Path
from fluidctl.diagnostics import progress, stragglers
from fluidctl.paths import DiagDir
diag, ranks, rate = DiagDir(Path(sys.argv[1])), int(sys.argv[2]), float(sys.argv[3])
pages = [memoryview(progress.map_shared(diag.steps(r), stragglers.SLOTS * 8)).cast("q")
         for r in range(ranks)]
step = 0
while True:
    time.sleep(1.0 / rate)
    step += 1
    for r, page in enumerate(pages):
        page[stragglers.COUNT] = step
        page[stragglers.COMPUTE] += 60_000_000 + 1_000_000 * (r % 7)
        page[stragglers.WAIT] += 40_000_000
        page[stragglers.DATA] += 5_000_000
"""


SCRAPER = r"""
import sys, time, urllib.request
url, every, seconds, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end, count, body = time.monotonic() + seconds, 0, b""
while time.monotonic() < end:
    began = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read()
    count += 1
    time.sleep(max(0.0, every - (time.monotonic() - began)))
open(out, "wb").write(body)
open(out + ".count", "w").write(str(count))
"""


class Handle:
    """A rank as the supervisor holds it (running)."""

    def __init__(self, rank, host, pid):
        self.rank, self.host, self.pid, self.label = rank, host, pid, f"trainer {rank}"

    def poll(self):
        return None


class Diag:
    """The launcher's Diagnostics as the publisher uses it: the pages and the hosts."""

    def __init__(self, root, per_node, ranks):
        from fluidctl.paths import DiagDir
        self.diag, self.per_node, self.ranks = DiagDir(Path(root)), per_node, ranks

    def step_samples(self):
        from fluidctl.diagnostics import stragglers
        return stragglers.read_all(self.diag)

    def hosts(self, handles):
        return {h.rank: h.host for h in handles}

    def usage(self):
        """What node agents report of their ranks' processes: one usage record per rank."""
        return {r: {"cpu": 12.5, "rss": 1 << 30} for r in range(self.ranks)}


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--per-node", type=int, default=8, help="ranks per (simulated) node")
    ap.add_argument("--steps", type=float, default=10.0, help="steps per second per rank")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to measure")
    ap.add_argument("--scrape", type=float, default=15.0,
                    help="seconds between scrapes (15: the usual scrape_interval)")
    ap.add_argument("--record", action="store_true", help="update bench/results.json")
    args = ap.parse_args()
    from fluidctl.observe.watching import Watching
    work = Path(tempfile.mkdtemp(prefix="observe-cost."))
    shm = Path(tempfile.mkdtemp(prefix="fluidctl_bench.", dir="/dev/shm"))
    log_root = work / "log"
    log_root.mkdir()
    for r in range(args.ranks):
        (log_root / f"workerlog.{r}").write_text(f"step 1/100000 rank {r}\n")
    sim = subprocess.Popen([sys.executable, "-c", RANKS_SIM, str(shm), str(args.ranks),
                            str(args.steps)])
    top = watching = None
    try:
        handles = [Handle(r, f"node{r // args.per_node}", sim.pid) for r in range(args.ranks)]
        watching = Watching(log_root, {"backend": "bench", "job": "observe-cost",
                                       "hang_timeout": 600}, "127.0.0.1", 0)
        deadline = time.monotonic() + 30
        while not any(shm.glob("steps.*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        watching.attach(Diag(shm, args.per_node, args.ranks), lambda: handles)
        top = subprocess.Popen([sys.executable, "-m", "fluidctl", "top", str(log_root),
                                "--json", "--interval", "1"], stdout=subprocess.DEVNULL,
                               stderr=open(work / "top.err", "w"))
        time.sleep(3.0)                 # warm: the first readings, top's start
        import psutil
        top_proc = psutil.Process(top.pid)
        top_cpu0 = sum(top_proc.cpu_times()[:2])
        wall0, cpu0 = time.monotonic(), cpu_seconds()
        # Prometheus's part, in a process of its own: a scrape every --scrape seconds
        scraper = subprocess.run(
            [sys.executable, "-c", SCRAPER, watching.url, str(args.scrape),
             str(args.seconds), str(work / "last.txt")], timeout=args.seconds + 60)
        wall, cpu = time.monotonic() - wall0, cpu_seconds() - cpu0
        top_cpu = sum(top_proc.cpu_times()[:2]) - top_cpu0
        assert top.poll() is None, f"fluidctl top ended early: exit {top.returncode}"
        assert scraper.returncode == 0
        body = (work / "last.txt").read_bytes()
        scrapes = int((work / "last.txt.count").read_text())
        assert body.count(b"fluidctl_step_seconds_count{") == args.ranks, body[:400]
    finally:
        if top is not None:
            top.terminate()
            top.wait(10)
        sim.terminate()
        sim.wait(10)
        if watching is not None:
            watching.close()
        import shutil
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    share = cpu / wall * 100
    print(f"ranks {args.ranks}, {args.steps:g} steps/s each, live.json every 1 s, "
          f"a scrape every {args.scrape:g} s ({scrapes} scrapes), {wall:.1f} s")
    print(f"launcher's extra CPU: {cpu:.3f} s over {wall:.1f} s = {share:.2f}% of a core "
          f"(scrapes included; goal <= 2%)")
    print(f"one scrape: {len(body)} bytes")
    print(f"fluidctl top --json (its own process): {top_cpu / wall * 100:.2f}% of a core")
    if args.record:
        sys.path.insert(0, str(Path(__file__).parent))
        from results import record
        record("observe-64", what=f"the launcher's extra CPU while fluidctl top watches and "
                                  f"Prometheus scrapes (every {args.scrape:g} s) "
                                  f"{args.ranks} ranks",
               fluidctl=f"{share:.2f}% of a core (goal <= 2%); top itself "
                        f"{top_cpu / wall * 100:.1f}%",
               peer="torchrun, horovodrun: no live view", ratio="-",
               machine="2 cores, shared with other work",
               command=f"python bench/observe_cost.py --ranks {args.ranks} "
                       f"--seconds {args.seconds:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
