"""--equalize: truncate cuts every shard's byte ranges to the smallest record count before
writing; pad appends records re-sampled (seeded, without replacement while it can) from a shard
after it is written, continuing its count and sha256."""
from __future__ import annotations

import os

import numpy as np

from fluidctl.sharding.copy import ShardWriter
from fluidctl.sharding.inputs import Source
from fluidctl.sharding.options import Progress
from fluidctl.sharding.parallel import StopFlag
from fluidctl.sharding.plan import Segment
from fluidctl.sharding.scan import NEWLINE, _count_range, _offset_after_newline, rfind_newline

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import List, Sequence


def truncate_plan(sources: Sequence[Source], plan: List[Segment], keep: int) -> List[Segment]:
    """The first ``keep`` records of a shard's segments (which hold more than that)."""
    out: List[Segment] = []
    remaining = keep
    for seg in plan:
        if remaining == 0:
            break
        if seg.src < 0:
            out.append(seg)
            remaining -= seg.data.count(b"\n")
            continue
        path = sources[seg.src].path
        here = _count_range(path, seg.start, seg.end, 1 << 62)
        if here < remaining:
            out.append(seg)
            remaining -= here
            continue
        end = _offset_after_newline(path, seg.start, seg.end, remaining - 1)
        out.append(Segment(seg.src, seg.start, end))
        remaining = 0
    return out


def count_plan(sources: Sequence[Source], plan: List[Segment]) -> int:
    newlines, last = 0, NEWLINE
    size = 0
    for seg in plan:
        if seg.src < 0:
            newlines += seg.data.count(b"\n")
            last = seg.data[-1] if seg.data else last
        else:
            path = sources[seg.src].path
            newlines += _count_range(path, seg.start, seg.end, 1 << 62)
            with open(path, "rb") as f:
                f.seek(seg.end - 1)
                last = f.read(1)[0]
        size += seg.length
    return newlines + (1 if size and last != NEWLINE else 0)


def _picks_here(rng: np.random.Generator, here: int, later: int, picks: int) -> int:
    """How many of ``picks`` records drawn without replacement from ``here + later`` fall among
    the first ``here``: hypergeometric (binomial beyond numpy's 10**9 limit, clamped so the
    rest still fit in ``later``)."""
    if later == 0:
        return picks
    if here + later < 10 ** 9:
        return int(rng.hypergeometric(here, later, picks))
    drawn = int(rng.binomial(picks, here / (here + later)))
    return max(picks - later, min(here, drawn))


def pad_shard(writer: ShardWriter, header_lines: int, extra: int,
              rng: np.random.Generator, progress: Progress) -> None:
    """Append ``extra`` records re-sampled from the shard itself, continuing its count and
    sha256. Without replacement: when ``extra`` exceeds the shard's records, every record is
    first repeated ``extra // records`` times, then the rest are sampled.

    How many picks fall in each written piece is drawn from the hypergeometric law using the
    piece's newline count, so only pieces holding picks are read, and the picks are never all
    in memory at once."""
    records = writer.records - header_lines
    if extra <= 0 or records <= 0:
        return
    if writer.last_byte != NEWLINE:
        writer.write(b"\n")
    size, pieces = writer.bytes, list(writer.pieces)
    copies, picks_left = divmod(extra, records)
    if copies:
        data_start = 0
        if header_lines:
            data_start = _offset_after_newline(writer.path, 0, size, header_lines - 1)
        for _ in range(copies):
            writer.copy_range(writer.path, data_start, size, StopFlag())
    records_left = records
    line = 0                                  # index of the first line ending in this piece
    fd = os.open(writer.path, os.O_RDONLY)
    try:
        for start, end, newlines in pieces:
            first = max(line, header_lines)   # first record (not header) ending here
            here_records = line + newlines - first
            line += newlines
            if here_records <= 0 or picks_left == 0:
                records_left -= max(0, here_records)
                continue
            here = _picks_here(rng, here_records, records_left - here_records, picks_left)
            records_left -= here_records
            if not here:
                continue
            data = os.pread(fd, end - start, start)
            progress.advance(len(data))
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == NEWLINE) + 1
            chosen = np.sort(rng.choice(here_records, size=here, replace=False))
            chosen += first - (line - newlines)
            added = []
            for k in chosen.tolist():
                e = int(ends[k])
                if k:
                    added.append(data[int(ends[k - 1]):e])
                else:                         # starts in an earlier piece
                    s = rfind_newline(writer.path, 0, start) + 1
                    added.append(os.pread(fd, start + e - s, s))
            writer.write(b"".join(added))
            picks_left -= here
    finally:
        os.close(fd)
