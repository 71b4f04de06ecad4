"""Every rank's step time over the job's life, for ``fluidctl report``: the straggler watcher
already reads every rank's sums (``diagnostics/stragglers.py``'s pages, or the node agents'
``steps`` lines) every quarter second; ``StepHistory`` takes those same readings, so the
ranks pay nothing new, and writes one record per ``every`` seconds to
``LogLayout.step_history``.

A record (one JSON object a line)::

    {"t": END_EPOCH, "dt": SECONDS, "ranks": {"RANK": [N, STEP_MS, OWN_MS, DATA_MS], ...}}

per rank over the interval: N collectives (or marked steps) completed; STEP_MS, the time per
collective, waiting included; OWN_MS, the rank's own part of it (compute for
``fluidctl.runtime``; for marks, the time from the last rank's arrival at the previous
collective to this rank's at the next, as ``stragglerwatch.classify_marks`` reckons it: long
for a straggler, short for the ones who wait for it); DATA_MS, its data loader's.

Bounded: at most ``capacity(ranks)`` records (fewer for larger jobs). When full, neighbours are
merged in pairs (weighted by N) and the interval doubles, so a week-long job keeps its whole
span at a coarser grain; the file is then rewritten whole (``write_atomic``), else appended.
The first line is the header ``{"every": SECONDS, "capacity": N}``. A job run again in the
same log dir (a requeued one) goes on with the file, as with ``events.jsonl``.

Standard library only; never raises into the watcher (a write that fails stops the history).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

EVERY = 1.0                 # seconds per record to begin with
MAX_RECORDS = 1024          # records kept for a small job ...
MIN_RECORDS = 16            # ... and at least this many for the largest
NUMBERS = 262_144           # rank entries kept (ranks x records; ~22 bytes each) beyond that


def capacity(ranks: int) -> int:
    """Records kept for a job of ``ranks`` ranks: the file holds about NUMBERS rank entries at
    most (6 MB), more only where MIN_RECORDS needs more (above 16,384 ranks)."""
    return max(MIN_RECORDS, min(MAX_RECORDS, NUMBERS // max(1, ranks)))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def interval_of(before, now, peers: Mapping[int, object] = ()) -> Optional[List[float]]:
    """[N, STEP_MS, OWN_MS, DATA_MS] of one rank between two readings (``stragglers.Sample``),
    None when it did nothing or restarted in between (its sums went back)."""
    n = now.count - before.count
    if n <= 0:
        return None
    if not now.marks:           # fluidctl.runtime's sums
        compute, wait = now.compute - before.compute, now.wait - before.wait
        if compute < 0 or wait < 0:
            return None
        return [n, _ms((compute + wait) / n / 1e9), _ms(compute / n / 1e9),
                _ms(max(0, now.data - before.data) / n / 1e9)]
    marks = [(s, t) for s, t in now.marks if s > before.count]
    if len(marks) < 2:
        return None
    step = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0]) / 1e9
    return [n, _ms(step), _ms(_own_of_marks(now, peers) or 0.0),
            _ms(max(0, now.data - before.data) / n / 1e9)]


def _own_of_marks(mine, peers: Mapping[int, object]) -> Optional[float]:
    """A marking rank's own time per collective over the newest consecutive seqs every rank
    holds: from the last arrival at s-1 to its own arrival at s (seconds)."""
    rings = [dict(p.marks) for p in peers.values() if p.marks] or [dict(mine.marks)]
    own = dict(mine.marks)
    common = sorted(set(own).intersection(*map(set, rings)))
    pairs = [(a, b) for a, b in zip(common, common[1:]) if b == a + 1]
    if not pairs:
        return None
    last = {s: max(r[s] for r in rings) for s in common}
    return sum(max(0, own[b] - last[a]) for a, b in pairs) / len(pairs) / 1e9


def merge(a: dict, b: dict) -> dict:
    """Two neighbouring records as one (each rank's times weighted by its N)."""
    ranks: Dict[str, List[float]] = {}
    for rank in set(a["ranks"]) | set(b["ranks"]):
        x, y = a["ranks"].get(rank), b["ranks"].get(rank)
        if x is None or y is None:
            ranks[rank] = list(x or y)
            continue
        n = x[0] + y[0]
        ranks[rank] = [n] + [round((x[i] * x[0] + y[i] * y[0]) / n, 3) for i in (1, 2, 3)]
    return {"t": b["t"], "dt": round(a["dt"] + b["dt"], 3), "ranks": ranks}


class StepHistory:
    """Called with every reading the straggler watcher takes (``{rank: Sample}``)."""

    def __init__(self, path: Path, every: float = EVERY, clock=time.time):
        self.path, self.every, self.clock = Path(path), every, clock
        # a job run again in the same log dir (a requeued one) goes on with the history, as
        # events.jsonl does: its records and the grain they were merged to
        self.records: List[dict] = read_history(self.path)
        from fluidctl.telemetry.sink import read_records
        header = read_records(self.path, lambda r: "every" in r)[:1]
        if self.records and header and isinstance(header[0]["every"], (int, float)):
            self.every = max(every, float(header[0]["every"]))
        self.base: Dict[int, object] = {}           # rank -> its Sample at the bucket's start
        self.began: Optional[float] = None
        self.cap = MAX_RECORDS
        self.failed = False

    def __call__(self, now: Mapping[int, object]) -> None:
        if self.failed or not now:
            return
        try:
            self._take(now)
        except Exception:       # noqa: BLE001 - the history must never stop the watcher
            self.failed = True

    def _take(self, now: Mapping[int, object]) -> None:
        when = self.clock()
        if self.began is None:
            self.base, self.began = dict(now), when
            return
        if when - self.began < self.every:
            return
        ranks = {}
        for rank, sample in now.items():
            before = self.base.get(rank)
            got = interval_of(before, sample, now) if before is not None else None
            if got is not None:
                ranks[str(rank)] = got
        record = {"t": round(when, 3), "dt": round(when - self.began, 3), "ranks": ranks}
        self.base, self.began = dict(now), when
        if ranks:
            self.cap = capacity(len(now))
            self._keep(record)

    def _keep(self, record: dict) -> None:
        self.records.append(record)
        if len(self.records) > self.cap:
            self.records = self._halved(self.records)
            self.every *= 2
            self._rewrite()
        elif len(self.records) == 1 or not self.path.exists():
            self._rewrite()
        else:                   # an OSError (the log dir went away) ends the history
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(_line(record))

    @staticmethod
    def _halved(records: Sequence[dict]) -> List[dict]:
        out = [merge(a, b) for a, b in zip(records[0::2], records[1::2])]
        if len(records) % 2:
            out.append(records[-1])
        return out

    def _rewrite(self) -> None:
        from fluidctl.paths import write_atomic
        header = {"every": self.every, "capacity": self.cap}
        write_atomic(self.path, _line(header) + "".join(map(_line, self.records)))


def _line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def read_history(path: Path) -> List[dict]:
    """The records of a step history, oldest first ([] when there is none)."""
    from fluidctl.telemetry.sink import read_records
    return read_records(path, lambda r: isinstance(r.get("ranks"), dict)
                        and isinstance(r.get("t"), (int, float)))
