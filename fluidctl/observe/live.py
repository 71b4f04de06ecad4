"""The launcher's side of ``fluidctl top`` and the metrics endpoint: step times from the pages
it already reads, written to ``LOG_DIR/live.json`` once a second.

Every ``EVERY`` seconds the ``Publisher`` takes the job's ``Diagnostics.step_samples()`` (the
same numbers the straggler watcher reads) and, per rank, turns them into step times: with
``fluidctl.runtime``'s sums, the mean time per collective since the last reading (compute and
wait); with marks (torch, Paddle), the time between consecutive marks. It keeps a histogram
and the last ``KEEP`` step times of each rank (for p50/p99), the data/compute/communication
shares over the last ``SHARE_WINDOW`` seconds, each rank's host and state (from the
supervisor's handles), and writes them whole (``paths.write_atomic``): a reader never sees
half a file, and nothing is asked of the ranks.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Deque, Dict, List, Mapping, Optional, Tuple

from fluidctl.paths import LogLayout, write_atomic

EVERY = 1.0             # seconds between rewrites of live.json
KEEP = 256              # step times kept per rank for the percentiles
SHARE_WINDOW = 5.0      # seconds the data/compute/comm shares and the rates span
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
# the step-time histogram's upper bounds (seconds; +Inf after): few, since every rank's
# histogram is a series per bucket at every scrape
VERSION = 1
PIDS_EVERY = 5.0        # seconds between looks at the ranks' registrations (rank.N files)


def percentile(values, q: float) -> Optional[float]:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; None for none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


class RankTimes:
    """One rank's step times, from successive readings of its page (a ``stragglers.Sample``)."""

    def __init__(self):
        self.recent: Deque[float] = deque(maxlen=KEEP)
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.total = 0.0                # seconds observed (the histogram's sum)
        self.observed = 0               # steps observed (its count)
        self.history: Deque[Tuple[float, object]] = deque()     # (when, sample)
        self.last_mark = 0              # marks: the newest seq already counted

    def _observe(self, seconds: float, times: int = 1) -> None:
        if seconds < 0 or times <= 0:
            return
        for _ in range(min(times, KEEP)):
            self.recent.append(seconds)
        index = next((i for i, bound in enumerate(BUCKETS) if seconds <= bound), len(BUCKETS))
        self.buckets[index] += times
        self.total += seconds * times
        self.observed += times

    def add(self, when: float, sample) -> None:
        previous = self.history[-1][1] if self.history else None
        if previous is not None and sample.count < previous.count:     # a new attempt
            self.history.clear()
            self.last_mark, previous = 0, None
        if sample.marks:
            pairs = [p for p in sample.marks if p[0] > self.last_mark]
            times = dict(sample.marks)
            for seq, at in pairs:
                if seq - 1 in times:
                    self._observe((at - times[seq - 1]) / 1e9)
            if pairs:
                self.last_mark = pairs[-1][0]
        elif previous is not None and sample.count > previous.count:
            done = sample.count - previous.count
            spent = (sample.compute + sample.wait) - (previous.compute + previous.wait)
            self._observe(spent / done / 1e9, done)
        self.history.append((when, sample))
        while len(self.history) > 2 and when - self.history[1][0] >= SHARE_WINDOW:
            self.history.popleft()

    def record(self) -> dict:
        """What live.json holds for this rank."""
        when, now = self.history[-1]
        then, before = self.history[0]
        out = {"count": now.count, "source": now.source, "p50": percentile(self.recent, 0.5),
               "p99": percentile(self.recent, 0.99), "buckets": list(self.buckets),
               "sum": self.total, "observed": self.observed, "rate": None, "shares": None}
        if when > then and now.count >= before.count:
            out["rate"] = (now.count - before.count) / (when - then)
        data = now.data - before.data
        if now.marks:
            spent = (now.marks[-1][1] - before.marks[-1][1]) if before.marks else 0
            if spent > 0:
                d = min(1.0, data / spent)
                out["shares"] = {"data": d, "compute": 1.0 - d, "comm": None}
        else:
            compute, wait = now.compute - before.compute, now.wait - before.wait
            if compute + wait > 0:
                d = min(data, compute)
                out["shares"] = {"data": d / (compute + wait),
                                 "compute": (compute - d) / (compute + wait),
                                 "comm": wait / (compute + wait)}
        return out


def rank_states(handles: List, hosts: Mapping[int, str]) -> Dict[int, dict]:
    """rank -> {host, pid, state} from the supervisor's handles: a rank's own process (local),
    or the node agent that runs it (ssh, fabric: ``copies`` names its ranks); a node declared
    lost marks every rank on it."""
    out: Dict[int, dict] = {r: {"host": h, "pid": None, "state": "unknown"}
                            for r, h in hosts.items()}
    for handle in handles:
        try:
            code = handle.poll()
        except Exception:       # noqa: BLE001 - a handle being closed
            continue
        state = "running" if code is None else ("done" if code == 0 else f"exit {code}")
        lost = getattr(handle, "lost_reason", None)
        why = lost() if callable(lost) else ""
        if why:
            state = "lost"
        if getattr(handle, "rank", None) is None and not getattr(handle, "copies", None) \
                and not getattr(handle, "service", False):
            for info in out.values():           # mpirun, an srun step: every rank it runs
                if info["state"] == "unknown" or code is not None:
                    info["state"] = state
            continue
        rank = getattr(handle, "rank", None)
        if rank is not None:
            out.setdefault(rank, {"host": handle.host, "pid": None})
            out[rank].update(pid=handle.pid, state=state)
            continue
        for tag in getattr(handle, "copies", None) or {}:
            if tag.startswith("trainer "):
                r = int(tag.split()[1])
                out.setdefault(r, {"host": handle.host, "pid": None})
                out[r]["state"] = state
                if why:
                    out[r]["why"] = why
    return out


class Publisher(threading.Thread):
    """Rewrites ``LOG_DIR/live.json`` every ``EVERY`` seconds while the job runs; ``state()``
    is the same record in memory (the metrics endpoint reads it at scrape time)."""

    def __init__(self, samples: Callable[[], Mapping], hosts: Callable[[list], Mapping],
                 handles: Callable[[], list], log_root: Path, meta: Optional[dict] = None,
                 every: float = EVERY, pids: Optional[Callable[[], Mapping]] = None,
                 usage: Optional[Callable[[], Mapping]] = None):
        super().__init__(name="fluidctl-live", daemon=True)
        self.samples, self.hosts, self.handles = samples, hosts, handles
        self.layout = LogLayout(Path(log_root))
        self.meta = dict(meta or {})
        self.every = every
        self.started = time.time()
        self.ranks: Dict[int, RankTimes] = {}
        self.pids = pids            # rank -> pid where the ranks register them (mpi, Slurm)
        self.usage = usage          # rank -> {cpu, rss, ...} that node agents report
        self._pids: Dict[int, int] = {}
        self._pids_at = 0.0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._state: dict = {}

    def step(self) -> dict:
        """One reading: every rank's sample and state, folded into the record."""
        now = time.monotonic()
        samples = dict(self.samples())
        handles = list(self.handles())
        states = rank_states(handles, dict(self.hosts(handles)))
        ranks = {}
        for rank, sample in samples.items():
            self.ranks.setdefault(rank, RankTimes()).add(now, sample)
        if states:                      # a new world: ranks that left it are not shown
            for gone in set(self.ranks) - set(states):
                del self.ranks[gone]
        if self.pids is not None and now - self._pids_at >= PIDS_EVERY and \
                any(s.get("pid") is None for s in states.values()):
            self._pids, self._pids_at = dict(self.pids()), now
        used = dict(self.usage()) if self.usage is not None else {}
        for rank in sorted(set(states) | set(self.ranks)):
            entry = dict(states.get(rank, {"host": None, "pid": None, "state": "unknown"}))
            if entry.get("pid") is None and rank in self._pids:
                entry["pid"] = self._pids[rank]
            if rank in used and entry.get("state") == "running":
                entry["usage"] = used[rank]
            if rank in self.ranks:
                entry.update(self.ranks[rank].record())
            ranks[str(rank)] = entry
        state = {"version": VERSION, "pid": os.getpid(), "host": os.uname().nodename,
                 "started": self.started, "time": time.time(), "world": len(ranks),
                 "buckets": list(BUCKETS), **self.meta, "ranks": ranks}
        with self._lock:
            self._state = state
        return state

    def state(self) -> dict:
        with self._lock:
            return self._state

    def publish(self) -> None:
        """One reading, written to live.json (never raises: the view must not stop the job)."""
        try:
            write_atomic(self.layout.live, json.dumps(self.step(), separators=(",", ":")))
        except Exception:       # noqa: BLE001
            pass

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.publish()

    def stop(self) -> None:
        """Stop, after a last record marked ``ended`` (how each rank ended, its last step and
        times): ``fluidctl top`` on a finished job shows it."""
        self._halt.set()
        try:
            state = dict(self.step(), ended=True)
            for entry in state["ranks"].values():       # the attempt's handles are gone
                if entry.get("state") in ("unknown", "running"):
                    entry["state"] = "ended"
            write_atomic(self.layout.live, json.dumps(state, separators=(",", ":")))
        except Exception:       # noqa: BLE001 - the log dir went away
            pass
