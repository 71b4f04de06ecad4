"""The step history's cost on the launcher and ``fluidctl report``'s time and size.

    python bench/report_history.py [--ranks 64 1024] [--hours 1]

Feeds ``StepHistory`` (fluidctl/telemetry/steptimes.py) the readings the straggler watcher
takes, four a second, for ``--hours`` of a job with one slow rank, in this process (the
clock is simulated, the file writes are real), and prints the CPU per reading, its share of
a core, the file's size and records; then times ``fluidctl report`` on that log dir (in
process: matplotlib already imported after the first) and prints the page's size.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fluidctl.diagnostics.stragglers import Sample
from fluidctl.telemetry.steptimes import StepHistory

MS = 1_000_000
POLL = 0.25


def one(ranks: int, hours: float) -> None:
    where = Path(tempfile.mkdtemp(prefix="fluidctl-bench-report."))
    now = [0.0]
    history = StepHistory(where / "steptimes.jsonl", clock=lambda: now[0])
    cpu, readings = 0.0, int(hours * 3600 / POLL)
    for i in range(readings):
        now[0] += POLL
        reading = {r: Sample(i * 4, i * 40 * MS * (3 if r == 7 else 1), i * 10 * MS, 0, 0, -1)
                   for r in range(ranks)}
        began = time.process_time()
        history(reading)
        cpu += time.process_time() - began
    size = (where / "steptimes.jsonl").stat().st_size
    print(f"{ranks} ranks, {hours:g} h: {cpu / readings * 1e6:.0f} us CPU per reading, "
          f"{cpu / (readings * POLL) * 100:.3f}% of a core; steptimes.jsonl {size / 1e3:.0f} kB, "
          f"{len(history.records)} records of {history.every:g} s", flush=True)
    (where / "launch.log").write_text("")
    from fluidctl.report.make import make
    began = time.monotonic()
    page = make(str(where))
    print(f"  fluidctl report: {time.monotonic() - began:.1f} s, "
          f"{page.stat().st_size / 1e3:.0f} kB", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--hours", type=float, default=1.0)
    args = p.parse_args()
    for ranks in args.ranks:
        one(ranks, args.hours)


if __name__ == "__main__":
    main()
