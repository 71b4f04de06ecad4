"""Stragglers, the launcher's side: every ``POLL`` seconds it reads every rank's sums (on many
nodes from the agents' ``steps`` lines), takes the differences over the last collectives and
asks ``classify``:

- slow compute: some ranks compute much longer per collective than the rest, while the rest
  wait about that long for them;
- slow data: the same, and the difference is time inside the rank's data loader;
- slow link: compute is even, everyone waits, and one node's links stream much slower than
  the others (the ranks that receive from it, or on it, see it).

Unmodified torch and Paddle scripts (``fluidctl.diagnostics.stepmarks``, installed in the rank
by ``fluidctl/diagnostics/inject/sitecustomize.py``) cannot be timed inside each collective; their
page holds *marks* instead: the wall-clock time (epoch ns) each rank reached the collectives
numbered ``seq`` (torch: its Flight Recorder's ``collective_seq_id``, the same numbering on
every rank; otherwise every ``backward`` call), in a ring of the last ``MARKS`` pairs, beside
the data-loader time. ``classify_marks`` aligns the ranks' rings by ``seq``: the rank that
reaches a collective last makes the others wait, so a straggler's mean *lag* (its time minus
the earliest rank's) is a share of a collective's time, and its *own* time (from the last
arrival at the previous collective to its arrival at this one) is a multiple of the others';
it is slow *data* when its extra data-loader time covers half the extra own time, else slow
*compute*. A slow *link* cannot be told from marks (every rank reaches the next collective
late alike), so only ``fluidctl.runtime`` names links. Marks of ranks on different nodes differ
by their clocks' error (NTP: about a millisecond), below ``MIN_EXCESS``.

A verdict seen in ``CONFIRM`` polls in a row is printed as one line (again only when it
changes, or every ``REPEAT`` seconds), appended to ``LOG_DIR/stragglers.log`` and written as
``LOG_DIR/stragglers.json``. One of slow compute from marks must also hold over two windows
that do not overlap (``Watcher.held``): on a machine with fewer cores than busy processes a
rank starved for half a second arrives as late as a slowed one, and only a slowed one stays
late.

The ranks' side (the pages and what writes them) is ``fluidctl.diagnostics.stragglers``.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from fluidctl.diagnostics.stragglers import (
    COMPUTE, DATA, EVIDENCE, LINK, POLL, RUNTIME, WAIT, Sample, read_all, to_wire)
from fluidctl.paths import DiagDir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fluidctl.telemetry import Sink

# --- the verdict -----------------------------------------------------------------------------

MIN_COLLECTIVES = 4      # a window spans at least this many collectives of every rank
RATIO = 3.0              # a straggler's own time is at least this many times the others'
SHARE = 0.25             # ... and its excess at least this share of a collective's time
MIN_EXCESS = 0.002       # ... and at least this many seconds per collective
WAITED = 0.5             # the others waited for at least this share of the excess
LINK_SHARE = 0.25        # a slow link streams at least this share of a collective's time
MARK_SHARE = 0.3         # marks: a straggler arrives this share of a collective's time late
OWN_RATIO = 2.0          # ... and its own time (see classify_marks) is this many times the others'
GROUP = 0.5              # ... and it is at least this share as late as the latest rank


class Verdict(NamedTuple):
    kind: str                   # "compute", "data" or "link"
    ranks: Tuple[int, ...]      # the slow ranks (for a link: the ranks receiving on it)
    slow: float                 # seconds per collective: the slow ranks' own time
    normal: float               # ... the others'
    step: float                 # seconds per collective, wait included
    collectives: int            # how many collectives the window spans
    at: int = 0                 # the most collectives any rank had completed then
    links: Tuple[Tuple[int, int], ...] = ()     # (from rank, to rank) for a link
    source: int = RUNTIME       # whose numbers: RUNTIME, FLIGHT_RECORDER or MARKERS
    lag: float = 0.0            # marks: seconds the slow ranks reach a collective after the first

    def key(self) -> Tuple[str, Tuple[int, ...]]:
        return self.kind, self.ranks


def _split(values: Mapping[int, float]) -> Tuple[float, List[int]]:
    """(the typical value: the mean of the lower half, the ranks well above it)."""
    base = _lower_mean(values.values())
    return base, [r for r, v in values.items() if v >= RATIO * base and v - base >= MIN_EXCESS]


def classify(before: Mapping[int, Sample], now: Mapping[int, Sample]) -> Optional[Verdict]:
    """What slowed the job between two readings of every rank's sums (None: nothing, or too
    few collectives in between to tell)."""
    ranks = sorted(set(before) & set(now))
    if len(ranks) < 2:
        return None
    sources = {now[r].source for r in ranks}
    if sources != {RUNTIME}:
        return classify_marks(before, now) if RUNTIME not in sources else None
    n = {r: now[r].count - before[r].count for r in ranks}
    done = min(n.values())
    if done < MIN_COLLECTIVES or min(before[r].count for r in ranks) < 1:
        return None

    def per(field: int) -> Dict[int, float]:
        return {r: (now[r][field] - before[r][field]) / n[r] / 1e9 for r in ranks}

    compute, wait, data, link = per(COMPUTE), per(WAIT), per(DATA), per(LINK)
    step = max(compute[r] + wait[r] for r in ranks)
    base, slow = _split(compute)
    if slow and len(slow) < len(ranks):
        excess = min(compute[r] for r in slow) - base
        others = [wait[r] for r in ranks if r not in slow]
        if excess >= SHARE * step and min(others) >= WAITED * excess:
            data_excess = min(data[r] for r in slow) - min(data[r] for r in ranks)
            kind = "data" if data_excess >= 0.5 * excess else "compute"
            own = data if kind == "data" else compute
            normal = (min(own[r] for r in ranks) if kind == "data" else base)
            return Verdict(kind, tuple(sorted(slow)), max(own[r] for r in slow), normal, step,
                           done, max(now[r].count for r in ranks))
    ring = [r for r in ranks if now[r].peer >= 0]
    if len(ring) >= 2:
        base_link, slow_links = _split({r: link[r] for r in ring})
        slow_links = [r for r in slow_links if link[r] >= LINK_SHARE * step]
        if slow_links and len(slow_links) < len(ring):
            return Verdict("link", tuple(sorted(slow_links)),
                           max(link[r] for r in slow_links), base_link, step, done,
                           max(now[r].count for r in ranks),
                           tuple((now[r].peer, r) for r in sorted(slow_links)))
    return None


def classify_marks(before: Mapping[int, Sample], now: Mapping[int, Sample]) -> Optional[Verdict]:
    """What slowed a job whose ranks write marks, between two readings (None: nothing, or too
    few collectives to tell). Over the collectives after ``before`` that every rank's ring
    holds (at least MIN_COLLECTIVES + 1 of them, the newest), a rank's *own* time before collective s is from the last arrival at s-1 (everyone
    could go on then) to its own arrival at s: the straggler's is long, the others' short
    (they arrive, then wait). Its *lag* is how long after the first rank it arrives."""
    ranks = sorted(set(before) & set(now))
    if len(ranks) < 2:
        return None
    times = {r: dict(now[r].marks) for r in ranks}
    common = sorted(set.intersection(*(set(t) for t in times.values())))
    start = min(before[r].count for r in ranks)     # the window, and one pair's start before
    seqs = common[-max(MIN_COLLECTIVES + 1, sum(s > start for s in common)):]
    n = {r: now[r].count - before[r].count for r in ranks}
    pairs = [(a, b) for a, b in zip(seqs, seqs[1:]) if b == a + 1]
    if len(pairs) < MIN_COLLECTIVES or min(n.values()) < 1:
        return None
    first = {seq: min(times[r][seq] for r in ranks) for seq in seqs}
    last = {seq: max(times[r][seq] for r in ranks) for seq in seqs}
    own = {r: sum(max(0, times[r][b] - last[a]) for a, b in pairs) / len(pairs) / 1e9
           for r in ranks}
    lag = {r: sum(times[r][seq] - first[seq] for seq in seqs) / len(seqs) / 1e9 for r in ranks}
    step = (first[seqs[-1]] - first[seqs[0]]) / (seqs[-1] - seqs[0]) / 1e9
    base_lag = _lower_mean(lag.values())
    base = _lower_mean(own.values())
    late = [r for r in ranks if lag[r] - base_lag >= max(MIN_EXCESS, MARK_SHARE * step)
            and own[r] >= OWN_RATIO * base]
    if not late or len(late) == len(ranks):
        return None
    # The job waits for its latest rank; one far less late (starved of a core for a while, or
    # released last by the ring) only queues behind it and must not change the verdict.
    worst = max(lag[r] - base_lag for r in late)
    slow = [r for r in late if lag[r] - base_lag >= GROUP * worst]
    excess = min(own[r] for r in slow) - base
    data = {r: (now[r].data - before[r].data) / n[r] / 1e9 for r in ranks}
    normal_data = min(data.values())
    kind = "data" if min(data[r] for r in slow) - normal_data >= 0.5 * excess else "compute"
    own_slow, normal = ((max(data[r] for r in slow), normal_data) if kind == "data"
                        else (max(own[r] for r in slow), base))
    return Verdict(kind, tuple(slow), own_slow, normal, step, len(seqs),
                   max(now[r].count for r in ranks), source=now[slow[0]].source,
                   lag=max(lag[r] for r in slow))


def _lower_mean(values) -> float:
    """The typical value: the mean of the lower half."""
    ordered = sorted(values)
    low = ordered[:max(1, len(ordered) // 2)]
    return sum(low) / len(low)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _named(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    names = ", ".join(str(r) for r in ranks)
    where = sorted({hosts[r] for r in ranks if r in hosts})
    return (f"rank {names}" if len(ranks) == 1 else f"ranks {names}") + (
        f" ({', '.join(where)})" if where else "")


def common_node(links: Sequence[Tuple[int, int]], hosts: Mapping[int, str]) -> Optional[str]:
    """The node every slow link touches, if there is one."""
    sets = [{hosts.get(a), hosts.get(b)} - {None} for a, b in links]
    common = set.intersection(*sets) if sets else set()
    return next(iter(common)) if len(common) == 1 else None


def describe(v: Verdict, hosts: Mapping[int, str]) -> str:
    """The one line the launcher prints."""
    tail = f" (last {v.collectives} collectives, {_ms(v.step)} each)"
    if v.kind == "link":
        pairs = ", ".join(f"{a}->{b}" for a, b in v.links)
        node = common_node(v.links, hosts)
        at = f" at {node}" if node else ""
        return (f"fluidctl: straggler: slow link{at}: ranks {pairs} stream {_ms(v.slow)} per "
                f"collective against {_ms(v.normal)} on the other links, compute is even"
                + tail)
    what = "its data loader" if v.kind == "data" else "compute"
    verb, them = ("is", "it") if len(v.ranks) == 1 else ("are", "them")
    said = (f"fluidctl: straggler: {_named(v.ranks, hosts)} {verb} slow {v.kind}: "
            f"{_ms(v.slow)} per collective in {what} against {_ms(v.normal)} on the others, "
            f"who wait")
    if v.source != RUNTIME:         # marks: the same line, with the lag and the source
        return (f"{said} {_ms(v.lag)} for {them} at each collective "
                f"({EVIDENCE.get(v.source, '')}; last {v.collectives} collectives, "
                f"{_ms(v.step)} each)")
    return f"{said} for {them}" + tail


# --- the launcher's watcher ------------------------------------------------------------------

CONFIRM = 3              # the same verdict this many readings in a row before it is said
REPEAT = 30.0            # the same verdict is said again after this many seconds
HISTORY = 40             # readings kept (windows reach back at most this far)
MIN_WINDOW = 0.75        # seconds a window spans at least (scheduling noise evens out)


class Watcher(threading.Thread):
    """Reads ``samples()`` every ``POLL`` seconds; emits a confirmed verdict to the job's
    telemetry ``sink`` (without one: a sink that says it through ``say`` and writes the
    reports and the events file under ``log_root``)."""

    def __init__(self, samples: Callable[[], Mapping[int, Sample]],
                 hosts: Callable[[], Mapping[int, str]], say: Callable[[str], None],
                 log_root: Path, poll: float = POLL,
                 clock: Callable[[], float] = time.monotonic, sink: "Optional[Sink]" = None,
                 readings: Optional[Callable[[Mapping[int, Sample]], None]] = None):
        super().__init__(name="fluidctl-stragglers", daemon=True)
        from fluidctl import telemetry
        self.samples, self.hosts, self.log_root = samples, hosts, log_root
        self.sink = sink if sink is not None else telemetry.for_job(log_root, say=say)
        self.poll, self.clock = poll, clock
        self.readings = readings        # also given every reading (the step history)
        self.history: List[Tuple[float, Mapping[int, Sample]]] = []
        self._halt = threading.Event()
        self._seen: Optional[Tuple[str, Tuple[int, ...]]] = None
        self._streak = 0
        self._streak_began = 0.0        # when the streak's first reading was taken
        self._window_began = 0.0        # where the last verdict's window began
        self._said: Dict[Tuple[str, Tuple[int, ...]], float] = {}

    def verdict(self, when: float, now: Mapping[int, Sample]) -> Optional[Verdict]:
        """Over the shortest window back from ``now`` that spans enough collectives and time."""
        for then, before in reversed(self.history):
            common = set(before) & set(now)
            if common and when - then >= MIN_WINDOW and \
                    min(now[r].count - before[r].count for r in common) >= MIN_COLLECTIVES:
                self._window_began = then
                return classify(before, now)
        return None

    def step(self) -> Optional[Verdict]:
        now, when = dict(self.samples()), self.clock()
        if not now:
            return None
        if self.readings is not None:
            self.readings(now)
        found = self.verdict(when, now)
        self.history = (self.history + [(when, now)])[-HISTORY:]
        if found is None:
            self._seen, self._streak = None, 0
            return None
        self._streak = self._streak + 1 if found.key() == self._seen else 1
        if self._streak == 1:
            self._streak_began = when
        self._seen = found.key()
        if self._streak < CONFIRM or not self.held(found):
            return None
        said = self._said.get(found.key())
        if said is not None and when - said < REPEAT:
            return None
        self._said[found.key()] = when
        self.report(found)
        return found

    def held(self, v: Verdict) -> bool:
        """Slow compute from marks (no loader time, no per-collective split to back it) is
        said once the same verdict came from a window that began after the streak's first
        reading was taken: two windows apart. The others, once seen CONFIRM times."""
        if v.kind != "compute" or v.source == RUNTIME:
            return True
        return self._window_began >= self._streak_began

    def report(self, v: Verdict) -> None:
        from fluidctl.telemetry import Straggler
        hosts = dict(self.hosts())
        self.sink.emit(Straggler(
            kind=v.kind, ranks=tuple(v.ranks),
            hosts={str(r): hosts[r] for r in v.ranks if r in hosts},
            links=tuple(tuple(p) for p in v.links), slow_s=v.slow, normal_s=v.normal,
            collective_s=v.step, collectives=v.collectives, at_collective=v.at,
            evidence=EVIDENCE.get(v.source, "from fluidctl.runtime's collectives"),
            line=describe(v, hosts)))

    def run(self) -> None:
        try:
            while not self._halt.wait(self.poll):
                self.step()
        except Exception as exc:        # never a traceback from here
            print(f"fluidctl: the straggler watcher stopped: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    def stop(self) -> None:
        self._halt.set()


def watch(diagnostics, handles: Callable[[], list], say: Callable[[str], None],
          sink: "Optional[Sink]" = None) -> Optional[Watcher]:
    """The launcher's watcher for a job's ``Diagnostics`` (its ``step_samples``: the ranks'
    sums from its node agents' ``steps`` lines, or from its own diagnostics directory), which
    also keeps the job's step history (``telemetry/steptimes.py``) from the same readings; None
    where the job writes no LOG_DIR reports (a node agent)."""
    if diagnostics is None or diagnostics.log_root is None:
        return None
    from fluidctl.paths import LogLayout
    from fluidctl.telemetry.steptimes import StepHistory
    history = StepHistory(LogLayout(Path(diagnostics.log_root)).step_history)
    watcher = Watcher(diagnostics.step_samples, lambda: diagnostics.hosts(handles()), say,
                      diagnostics.log_root, sink=sink, readings=history)
    watcher.start()
    return watcher


def publish(diag: DiagDir, emit: Callable[[str], None], halt: threading.Event,
            poll: float = POLL) -> None:
    """A node agent's loop: this node's ranks' sums as a ``steps`` line when they changed."""
    last = None
    while not halt.wait(poll):
        now = read_all(diag)
        if now and now != last:
            try:
                emit(to_wire(now))
            except (OSError, ValueError):       # the launcher is gone
                return
            last = now
