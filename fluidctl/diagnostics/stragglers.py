"""Stragglers: the one slow rank, link or data loader that sets everyone's pace.

The rank's side (``fluidctl.runtime``): every collective is timed against the one before it.
The time from the previous collective's return to this call is the rank's own work
(*compute*), the time inside is *waiting* for the peers; ``ShardReader`` adds the time spent
reading batches (*data*, a part of compute) and the ring adds the time its incoming link took
to stream a piece once the first bytes came (*link*). The sums go to ``steps.<rank>`` in the
node's diagnostics directory (``paths.DiagDir``): a few int64 in a shared memory page, one
store each, no system call.

The launcher's side (reading the sums, the verdict, the ``Watcher``) is
``fluidctl.diagnostics.stragglerwatch``: this module is what every training process imports, so
it holds only the page and its writers (and the one reader the node agents and the watchdog
share).

Standard library only: imported by training processes.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from fluidctl.diagnostics import progress
from fluidctl.paths import DiagDir

# --- the rank's side -------------------------------------------------------------------------

# steps.<rank>: int64 slots. 0-5: sums (COUNT: collectives, or the newest mark's seq), 6: SOURCE,
# 7: DATA_LIVE, then MARKS pairs (seq, epoch ns), seq's pair at MARK0 + 2 * (seq % MARKS).
# A Flight Recorder page's data loader adds to DATA_LIVE as it goes, and its dump thread sets
# DATA to the loader's time as of the newest collective it marks: DATA and COUNT then describe
# the same instant (a dump late under load would otherwise spread a window's data over too
# many collectives or too few, and a slow data loader read as slow compute).
COUNT, COMPUTE, WAIT, DATA, LINK, PEER, SOURCE, DATA_LIVE = range(8)
RUNTIME, FLIGHT_RECORDER, MARKERS = 0, 1, 2            # SOURCE: who wrote the page
MARK0, MARKS = 8, 64
SLOTS = MARK0 + 2 * MARKS
EVIDENCE = {FLIGHT_RECORDER: "from torch's collective records",
            MARKERS: "from step markers (backward calls)"}
_now = time.perf_counter_ns
POLL = 0.25              # seconds between readings (the watcher's, a copied page's writes)


class Recorder:
    """One rank's sums in shared memory (``steps.<rank>``); nanoseconds."""

    def __init__(self, diag: DiagDir, rank: int):
        marks = sys.modules.get("fluidctl.diagnostics.stepmarks")
        if marks is not None:           # a runtime script that also uses torch or Paddle:
            marks.stop()                # the runtime's own times are the better numbers
        self._map = progress.map_shared(diag.steps(rank), SLOTS * 8)
        self.sums = memoryview(self._map).cast("q")
        self.sums[:MARK0] = memoryview(bytes(MARK0 * 8)).cast("q")
        self.sums[PEER] = -1
        self.last = _now()

    def collective(self, began: int) -> None:
        """A collective called at ``began`` (``perf_counter_ns``) has just returned."""
        now = _now()
        sums = self.sums
        sums[COMPUTE] += began - self.last
        sums[WAIT] += now - began
        sums[COUNT] += 1
        self.last = now

    def close(self) -> None:
        self.sums.release()
        self._map.close()


_recorder: Optional[Recorder] = None


def start(rank: int, environ: Optional[Mapping[str, str]] = None) -> Optional[Recorder]:
    """Called by ``fluidctl.runtime.init()`` when the launcher gave a diagnostics directory;
    never fails the job over it."""
    global _recorder
    diag = progress.diag_of(environ)
    if _recorder is None and diag is not None:
        try:
            _recorder = Recorder(diag, rank)
        except (OSError, ValueError):
            _recorder = None
    return _recorder


def record(began: int) -> None:
    """After each collective: ``began = stragglers.clock()`` was taken before the call."""
    if _recorder is not None:
        _recorder.collective(began)


clock = _now


def add(slot: int, ns: int) -> None:
    """Time spent in the data loader (``DATA``) or streaming on the ring's link (``LINK``)."""
    if _recorder is not None:
        _recorder.sums[slot] += ns


def set_peer(rank: int) -> None:
    """The global rank this rank's ring link receives from (-1: none)."""
    if _recorder is not None:
        _recorder.sums[PEER] = rank


def timed_batches(batches):
    """``batches`` with the time each ``next`` took added to the rank's data time."""
    it = iter(batches)
    while True:
        began = _now()
        try:
            batch = next(it)
        except StopIteration:
            return
        finally:
            add(DATA, _now() - began)
        yield batch


# --- reading the sums ------------------------------------------------------------------------

class Sample(NamedTuple):
    count: int
    compute: int
    wait: int
    data: int
    link: int
    peer: int
    source: int = RUNTIME
    marks: Tuple[Tuple[int, int], ...] = ()     # (seq, epoch ns), seq ascending


def marks_of(slots: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
    """The ring's pairs, by seq. A pair the rank was rewriting while it was read (its time
    already the next round's) is later than the pair after it: such pairs are left out."""
    pairs = sorted((slots[i], slots[i + 1]) for i in range(MARK0, SLOTS, 2) if slots[i] > 0)
    return tuple(p for p, q in zip(pairs, pairs[1:] + [(0, 1 << 62)]) if p[1] <= q[1])


def sample_of(slots: Sequence[int]) -> Sample:
    source = slots[SOURCE]
    return Sample(*slots[:SOURCE], source, marks_of(slots) if source != RUNTIME else ())


def read_all(diag: DiagDir) -> Dict[int, Sample]:
    """Every rank's sums on this node: {rank: Sample}."""
    return {rank: sample_of(memoryview(data).cast("q"))
            for rank, data in diag.read_ranks("steps", SLOTS * 8).items()}


def to_wire(samples: Mapping[int, Sample]) -> str:
    """A node agent's ``steps`` line: per rank the 7 numbers, then the marks flattened."""
    return json.dumps({str(r): list(s[:7]) + [x for m in s.marks for x in m]
                       for r, s in samples.items()}, separators=(",", ":"))


def from_wire(text: str) -> Dict[int, Sample]:
    out = {}
    for r, v in json.loads(text).items():
        v = list(map(int, v))
        out[int(r)] = Sample(*v[:7], tuple(zip(v[7::2], v[8::2])))
    return out
