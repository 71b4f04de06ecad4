"""Where the shards are cut: the inputs as one logical stream of records, cut points at record
boundaries (--by lines) or whole files balanced over the shards (--by files). A plan is a list
of byte ranges (Segment) per shard; no data passes through Python."""
from __future__ import annotations

import bisect
import heapq
from collections import namedtuple

from fluidctl.errors import UsageError
from fluidctl.sharding.inputs import Source
from fluidctl.sharding.scan import _count_range, find_newline, rfind_newline

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import Dict, List, Sequence


class Segment(namedtuple("Segment", ("src", "start", "end", "data"), defaults=(-1, 0, 0, b""))):
    """A piece of a shard: bytes [start, end) of source ``src``, or literal ``data``."""
    __slots__ = ()

    @property
    def length(self) -> int:
        return len(self.data) if self.src < 0 else self.end - self.start


class Span(namedtuple("Span", ("src", "start", "end", "add_newline"))):
    """The records of one source in the logical stream: file bytes [start, end), plus a newline
    the file lacks when another file follows it (so two records never merge)."""
    __slots__ = ()

    @property
    def length(self) -> int:
        return self.end - self.start + (1 if self.add_newline else 0)


def make_spans(sources: Sequence[Source]) -> List[Span]:
    spans = []
    last = max((i for i, s in enumerate(sources) if s.data_bytes > 0), default=-1)
    for i, src in enumerate(sources):
        if src.data_bytes > 0:
            spans.append(Span(i, src.data_start, src.size,
                              add_newline=not src.ends_with_newline and i != last))
    return spans


class Stream:
    """The concatenated records of all inputs, addressed by logical offset; reads only what a
    question needs (cut points look at a few KiB around each target)."""

    def __init__(self, sources: Sequence[Source], spans: Sequence[Span]):
        self.sources = sources
        self.spans = list(spans)
        self.offsets = [0]
        for span in self.spans:
            self.offsets.append(self.offsets[-1] + span.length)
        self.length = self.offsets[-1]

    def _span_at(self, pos: int, right: bool) -> int:
        if right:   # span with offsets[k] <= pos < offsets[k+1]
            return bisect.bisect_right(self.offsets, pos) - 1
        return bisect.bisect_left(self.offsets, pos) - 1   # offsets[k] < pos <= offsets[k+1]

    def next_boundary(self, target: int) -> int:
        """The first record boundary at or after ``target``."""
        if target >= self.length:
            return self.length
        k = self._span_at(target, right=True)
        span, base = self.spans[k], self.offsets[k]
        local = target - base
        if local == 0:
            return target
        at = find_newline(self.sources[span.src].path, span.start + local - 1, span.end)
        return base + at - span.start + 1 if at >= 0 else self.offsets[k + 1]

    def prev_start(self, boundary: int) -> int:
        """The start of the record that ends at ``boundary``."""
        k = self._span_at(boundary, right=False)
        span, base = self.spans[k], self.offsets[k]
        local = boundary - base
        size = span.end - span.start
        src = self.sources[span.src]
        if local > size or (local == size and not src.ends_with_newline):
            search_end = span.end                       # record ends at the file's end
        else:
            search_end = span.start + local - 1         # skip the record's own newline
        at = rfind_newline(src.path, span.start, search_end)
        return base + at - span.start + 1 if at >= 0 else base

    def segments(self, a: int, b: int) -> List[Segment]:
        """Logical range [a, b) as byte ranges of the sources (and added newlines)."""
        out = []
        for k, span in enumerate(self.spans):
            base = self.offsets[k]
            size = span.end - span.start
            lo, hi = max(a, base), min(b, base + size)
            if lo < hi:
                out.append(Segment(span.src, span.start + lo - base, span.start + hi - base))
            if span.add_newline and a <= base + size < b:
                out.append(Segment(data=b"\n"))
        return out

    def count_records(self, limit: int) -> int:
        """Records in the whole stream, counting no further than ``limit``."""
        count = 0
        for span in self.spans:
            count += _count_range(self.sources[span.src].path, span.start, span.end, limit - count)
            if count >= limit:
                return count
            src = self.sources[span.src]
            if not src.ends_with_newline and span.end == src.size:
                count += 1
        return count


def plan_lines(stream: Stream, trainers: int, flag: str = "--trainers") -> List[List[Segment]]:
    """Contiguous shards of about 1/N of the bytes each, cut at record boundaries, each holding
    at least one record."""
    total = stream.length
    cuts = [0] * (trainers + 1)
    cuts[trainers] = total
    if trainers > total:                    # a record has at least one byte
        cuts = [0] * (trainers + 1)
    else:
        _place_cuts(stream, cuts)
    if any(cuts[i] >= cuts[i + 1] for i in range(trainers)):
        records = stream.count_records(trainers)
        raise UsageError(f"{trainers} {flag[2:]} but only {records} record(s) in the input",
                         f"pass {flag} {max(1, records)} or fewer")
    return [stream.segments(cuts[i], cuts[i + 1]) for i in range(trainers)]


def _place_cuts(stream: Stream, cuts: List[int]) -> None:
    """cuts[1..N-1] at the first record boundary after i/N of the bytes; then moved so that
    every shard holds a record (forward: at least one after the previous cut; backward: a
    record longer than 1/N must not leave the shards after it empty)."""
    trainers, total = len(cuts) - 1, stream.length
    for i in range(1, trainers):
        c = stream.next_boundary(i * total // trainers)
        if c <= cuts[i - 1] and cuts[i - 1] < total:
            c = stream.next_boundary(cuts[i - 1] + 1)
        cuts[i] = min(c, total)
    for i in range(trainers - 1, 0, -1):
        if cuts[i] >= cuts[i + 1]:
            cuts[i] = stream.prev_start(cuts[i + 1]) if cuts[i + 1] > 0 else 0


def plan_files(stream: Stream, sources: Sequence[Source], trainers: int,
               flag: str = "--trainers") -> List[List[Segment]]:
    """Whole files to shards, largest first onto the lightest shard; a shard keeps its files in
    input order."""
    if len(stream.spans) < trainers:
        raise UsageError(f"{trainers} {flag[2:]} but only {len(stream.spans)} non-empty input "
                         "file(s)", f"use --by lines, or fewer {flag}")
    lightest = [(0, i) for i in range(trainers)]       # heap of (bytes, shard)
    owner: Dict[int, int] = {}
    for k in sorted(range(len(stream.spans)), key=lambda k: (-stream.spans[k].length, k)):
        load, target = heapq.heappop(lightest)
        owner[k] = target
        heapq.heappush(lightest, (load + stream.spans[k].length, target))
    plans: List[List[Segment]] = [[] for _ in range(trainers)]
    for k, span in enumerate(stream.spans):
        segs = plans[owner[k]]
        if segs and segs[-1].src >= 0 and not sources[segs[-1].src].ends_with_newline:
            segs.append(Segment(data=b"\n"))
        segs.append(Segment(span.src, span.start, span.end))
    return plans
