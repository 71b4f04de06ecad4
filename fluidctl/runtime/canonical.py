"""Reading canonical shards (``fluidctl shard-data --shards N``) in the global order of
:mod:`fluidctl.runtime.order`: each rank's batches, and the state that resumes them at any world
size.

A window of whole steps (up to 16384 of this rank's positions, about 8 MiB of records at most)
is computed at once: positions -> (shard, record) with numpy (:mod:`fluidctl.runtime.orderwindow`,
the same numbers as the scalar order). Each shard is mapped read-only and its records are slices
of the mapping. The offsets of a shard's records come from its index file (``offsets/<shard>.idx``,
written by shard-data, :mod:`fluidctl.runtime.recordindex`), or, for shards written without one,
from one scan of the mapping for newlines; they are kept for that shard and the one before only
(8 bytes a record): the data set itself is never held in memory. A shard whose record count
differs from its manifest's is an error naming it, never read short.

numpy and the standard library; imported only by a reader of canonical shards.
"""
from __future__ import annotations

import json
import mmap
import os
from typing import Any, Iterator, List, Mapping, Optional

import numpy as np

from fluidctl.errors import UsageError
from fluidctl.runtime import order, orderwindow, recordindex

STATE_KEYS = ("epoch", "offset", "seed", "shuffle", "samples", "shards")
_NL, _CR = 10, 13
_UTF8 = ("utf-8", "utf8", "UTF-8")
_WINDOW = 16384          # positions of one rank computed and read together, at most
_WINDOW_BYTES = 8 << 20   # and about this many bytes of records
_REFUSED = "pass the state saved by a reader over the same shards, seed and shuffle"


class RecordFile:
    """One shard's records by index: the shard mapped read-only, the byte offset of every
    record's start (and the end of the last) from its index file ``index`` when it fits the
    shard, else from one scan of the mapping for newlines; records are slices of the mapping."""

    def __init__(self, path: str, records: int, header_lines: int,
                 index: Optional[str] = None):
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise UsageError(f"cannot open shard {path}: {exc.strerror}",
                             "copy the shard directory again or re-run fluidctl shard-data") from None
        try:
            size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.unterminated = bool(size) and self.map[size - 1] != _NL
        self.plain = self.map.find(b"\r") < 0
        try:
            starts = recordindex.load(index, records, self.bytes, header_lines) if index else None
            self.starts = (recordindex.line_starts(self.bytes, header_lines) if starts is None
                           else starts)
        except BaseException:
            self.close()
            raise
        found = len(self.starts) - 1
        if found != records:
            self.close()
            raise UsageError(f"shard {path} holds {found} record(s), its manifest says {records}",
                             f"check it with: fluidctl shard-data --verify {os.path.dirname(path) or '.'}")

    def read(self, records: np.ndarray, encoding: Optional[str] = None) -> list:
        """The bytes of these records (an int64 array of indices), without their line
        endings (what ``bytes.rstrip(b"\\r\\n")`` leaves); str decoded with ``encoding``
        when given."""
        starts, ends = self.starts[records], self.starts[records + 1] - 1
        if self.plain:                  # every line ends in one LF, no CR anywhere
            if self.unterminated:       # but the last line has no LF
                ends[records == self.starts.size - 2] += 1
        else:
            ends += 1
            data, todo = self.bytes, np.arange(records.size)
            while todo.size:            # strip trailing CR and LF bytes, as rstrip does
                last = ends[todo] - 1
                more = (last >= starts[todo]) & ((data[last] == _NL) | (data[last] == _CR))
                todo = todo[more]
                ends[todo] -= 1
        view = self.map
        if (encoding in _UTF8 and self.plain and records.size
                and not (self.unterminated and ends.max() == self.starts[-1])):
            # every record here is its bytes then one LF, and LF occurs in UTF-8 text only
            # as itself: one decode of them all, split at the LFs
            text = b"".join([view[a:b] for a, b in zip(starts.tolist(), (ends + 1).tolist())])
            out = text.decode(encoding).split("\n")
            out.pop()
            return out
        if encoding is not None:
            return [view[a:b].decode(encoding) for a, b in zip(starts.tolist(), ends.tolist())]
        return [view[a:b] for a, b in zip(starts.tolist(), ends.tolist())]

    def close(self) -> None:
        self.bytes = None
        if isinstance(self.map, mmap.mmap):
            self.map.close()


def decoder(fmt: str, decode: bool, encoding: str):
    """bytes of one record -> what the reader yields for ``fmt``; None for text, which
    :meth:`RecordFile.read` decodes itself (or not)."""
    if fmt == "jsonl":
        return json.loads
    if fmt == "csv":
        import csv

        def row(line: bytes) -> List[str]:
            return next(csv.reader([line.decode(encoding)]))
        return row
    return None


def check_state(state: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple:
    """(epoch, offset) from a saved ``reader.state()``, after checking it belongs to these
    shards, seed and shuffle."""
    if not isinstance(state, Mapping) or any(k not in state for k in STATE_KEYS):
        raise UsageError(f"reader state {state!r} lacks {', '.join(STATE_KEYS)}", _REFUSED)
    for key in ("seed", "shuffle", "samples", "shards"):
        if state[key] != expected[key]:
            raise UsageError(f"the saved reader state has {key}={state[key]!r}, this reader "
                             f"{key}={expected[key]!r}", _REFUSED)
    epoch, offset = state["epoch"], state["offset"]
    if not (isinstance(epoch, int) and isinstance(offset, int) and epoch >= 0
            and 0 <= offset <= expected["samples"]):
        raise UsageError(f"reader state epoch={epoch!r} offset={offset!r} is out of range "
                         f"(offset 0..{expected['samples']})", _REFUSED)
    if offset == expected["samples"]:               # a finished epoch: the next one's start
        return epoch + 1, 0
    return epoch, offset


class CanonicalReader:
    """Rank ``rank`` of ``world``'s batches over canonical shards, from (seed, epoch, global
    offset); see :class:`fluidctl.runtime.data.ShardReader` for the user's side."""

    def __init__(self, paths: List[str], counts: List[int], fmt: str, batch_size: int, *,
                 rank: int, world: int, seed: int, shuffle: bool, drop_last: bool,
                 decode: bool, encoding: str = "utf-8",
                 state: Optional[Mapping[str, Any]] = None,
                 indexes: Optional[List[Optional[str]]] = None):
        self.paths, self.counts = paths, counts
        self.indexes = indexes or [None] * len(paths)
        self.header_lines = 1 if fmt == "csv" else 0
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.samples = sum(counts)
        self._decode = decoder(fmt, decode, encoding)
        self._encoding = encoding if fmt == "text" and decode else None
        self._sizes: Optional[List[int]] = None
        self._open: dict = {}
        self.epoch, self.offset = 0, 0
        if state is not None:
            self.epoch, self.offset = check_state(state, self._identity())

    def _identity(self) -> dict:
        return {"seed": self.seed, "shuffle": self.shuffle, "samples": self.samples,
                "shards": len(self.paths)}

    def state(self) -> dict:
        """What to save with a checkpoint: every batch handed out so far counts as consumed.
        The same on every rank; resume with ``ShardReader(..., state=saved)`` at any world size.
        At the end of an epoch (no step left) it is the next epoch's start."""
        if len(self) == 0:
            return {"epoch": self.epoch + 1, "offset": 0, **self._identity()}
        return {"epoch": self.epoch, "offset": self.offset, **self._identity()}

    def __len__(self) -> int:
        """Steps left in this epoch: the same number on every rank."""
        return order.steps_left(self.offset, self.samples, self.batch_size * self.world,
                                self.drop_last)

    def __iter__(self) -> Iterator[list]:
        """The rest of the current epoch, then the reader stands at the next epoch's start.

        A rank's positions over its remaining steps are one arithmetic progression (``offset
        + rank``, step ``world``; every step but the last is full), so a window of whole steps
        is computed at once (:mod:`fluidctl.runtime.orderwindow`) and read shard by shard."""
        epoch_order = order.EpochOrder(self.counts, self.seed, self.epoch, self.shuffle)
        per_step, batch_size = self.batch_size * self.world, self.batch_size
        steps = len(self)
        base = self.offset
        stop = min(self.samples, base + steps * per_step)
        window = max(1, self._window_records() // batch_size)
        try:
            for first in range(0, steps, window):
                count = min(window, steps - first)
                positions = np.arange(base + first * per_step + self.rank,
                                      min(stop, base + (first + count) * per_step), self.world,
                                      dtype=np.int64)
                records = self._read(epoch_order, positions)
                for k in range(count):
                    batch = records[k * batch_size:(k + 1) * batch_size]
                    self.offset = order.offset_after(self.offset, 1, per_step, self.samples)
                    yield batch
            self.epoch, self.offset = self.epoch + 1, 0
        finally:
            self.close()

    def _window_records(self) -> int:
        """Records read together: ``_WINDOW``, fewer where the shards' mean record is so long
        that they would hold more than ``_WINDOW_BYTES`` (at least one step's)."""
        if self._sizes is None:
            self._sizes = [os.stat(p).st_size for p in self.paths]
        mean = max(1, sum(self._sizes) // max(1, self.samples))
        return max(1, min(_WINDOW, _WINDOW_BYTES // mean))

    def _read(self, epoch_order: order.EpochOrder, positions: np.ndarray) -> list:
        """The decoded records at these positions, in their order."""
        slots, shards, records = orderwindow.samples(epoch_order, positions)
        out: list = []
        cuts = (np.flatnonzero(np.diff(slots)) + 1).tolist()
        decode, encoding = self._decode, self._encoding
        for lo, hi in zip([0, *cuts], [*cuts, positions.size]):
            if lo < hi:
                raw = self._source(int(shards[lo])).read(records[lo:hi], encoding)
                out.extend(raw if decode is None else map(decode, raw))
        return out

    def _source(self, shard: int) -> RecordFile:
        source = self._open.get(shard)
        if source is None:
            if len(self._open) >= 2:    # positions only move forward: older shards are done
                oldest = next(iter(self._open))
                self._open.pop(oldest).close()
            source = self._open[shard] = RecordFile(self.paths[shard], self.counts[shard],
                                                    self.header_lines, self.indexes[shard])
        return source

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()
