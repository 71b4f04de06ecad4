"""Reading canonical shards (``fluidctl shard-data --shards N``) in the global order of
:mod:`fluidctl.runtime.order`: each rank's batches, and the state that resumes them at any world
size.

Records are read one at a time by offset (``os.pread``). The offsets of a shard's records are
found by one sequential read of it when the order first enters it, and kept for that shard and
the one before only (8 bytes a record): the data set itself is never held in memory. A shard
whose record count differs from its manifest's is an error naming it, never read short.

Standard library only, like :mod:`fluidctl.runtime.data`.
"""
from __future__ import annotations

import json
import os
from array import array
from itertools import accumulate
from typing import Any, Iterator, List, Mapping, Optional

from fluidctl.errors import UsageError
from fluidctl.runtime import order

STATE_KEYS = ("epoch", "offset", "seed", "shuffle", "samples", "shards")
_CHUNK = 1 << 20
_REFUSED = "pass the state saved by a reader over the same shards, seed and shuffle"


class RecordFile:
    """One shard's records by index: offsets from one sequential read, records by pread."""

    def __init__(self, path: str, records: int, header_lines: int):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise UsageError(f"cannot open shard {path}: {exc.strerror}",
                             "copy the shard directory again or re-run fluidctl shard-data") from None
        try:
            self.starts = self._index(header_lines)
        except BaseException:
            os.close(self.fd)
            raise
        found = len(self.starts) - 1
        if found != records:
            os.close(self.fd)
            raise UsageError(f"shard {path} holds {found} record(s), its manifest says {records}",
                             f"check it with: fluidctl shard-data --verify {os.path.dirname(path) or '.'}")

    def _index(self, header_lines: int) -> array:
        """Byte offset of every line's start, then the end of the last line (a last line
        without its newline included); the header's lines dropped."""
        with open(self.fd, "rb", buffering=_CHUNK, closefd=False) as lines:
            starts = array("Q", accumulate(map(len, lines), initial=0))
        del starts[:header_lines]
        return starts

    def read(self, index: int) -> bytes:
        start, end = self.starts[index], self.starts[index + 1]
        return os.pread(self.fd, end - start, start).rstrip(b"\r\n")

    def close(self) -> None:
        os.close(self.fd)


def decoder(fmt: str, decode: bool, encoding: str):
    """bytes of one record -> what the reader yields for ``fmt``."""
    if fmt == "jsonl":
        return json.loads
    if fmt == "csv":
        import csv

        def row(line: bytes) -> List[str]:
            return next(csv.reader([line.decode(encoding)]))
        return row
    if decode:
        return lambda line: line.decode(encoding)
    return lambda line: line


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
                 state: Optional[Mapping[str, Any]] = None):
        self.paths, self.counts = paths, counts
        self.header_lines = 1 if fmt == "csv" else 0
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.samples = sum(counts)
        self._decode = decoder(fmt, decode, encoding)
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
        """The rest of the current epoch, then the reader stands at the next epoch's start."""
        epoch_order = order.EpochOrder(self.counts, self.seed, self.epoch, self.shuffle)
        per_step = self.batch_size * self.world
        try:
            for positions in order.rank_steps(self.offset, self.rank, self.world,
                                              self.batch_size, self.samples, self.drop_last):
                batch: list = []
                for shard, records in epoch_order.runs(positions):
                    read, decode = self._source(shard).read, self._decode
                    batch.extend([decode(read(r)) for r in records])
                self.offset = order.offset_after(self.offset, 1, per_step, self.samples)
                yield batch
            self.epoch, self.offset = self.epoch + 1, 0
        finally:
            self.close()

    def _source(self, shard: int) -> RecordFile:
        source = self._open.get(shard)
        if source is None:
            if len(self._open) >= 2:    # positions only move forward: older shards are done
                oldest = next(iter(self._open))
                self._open.pop(oldest).close()
            source = self._open[shard] = RecordFile(self.paths[shard], self.counts[shard],
                                                    self.header_lines)
        return source

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()
