"""The record-offset index of a shard: the byte offset of every record's start, then the end of
the last record, as little-endian uint64 (its place: :func:`fluidctl.shardlayout.offsets_name`;
``fluidctl shard-data --shards N`` writes it and names it in the manifest with its size and
digest). The reader of canonical shards loads it instead of scanning the shard for newlines;
without it (shards written before it existed) the reader scans, with :func:`line_starts`.

Imports numpy: only canonical readers and ``shard-data --shards`` load this module.
"""
from __future__ import annotations

import os

import numpy as np

DTYPE = np.dtype("<u8")
_NL = 10
_CHUNK = 1 << 24            # bytes scanned for newlines at a time


def line_starts(data: np.ndarray, header_lines: int = 0) -> np.ndarray:
    """int64 byte offset of every line's start in ``data`` (uint8), then the end of the last
    line (a last line without its newline included); the first ``header_lines`` lines dropped.
    Scanned in pieces, so the scan's temporary arrays stay small whatever the shard's size."""
    size = data.size
    pieces = [np.zeros(1, dtype=np.int64)]
    for lo in range(0, size, _CHUNK):
        ends = np.flatnonzero(data[lo:lo + _CHUNK] == _NL)
        pieces.append(ends.astype(np.int64) + (lo + 1))
    if size and data[size - 1] != _NL:
        pieces.append(np.array([size], dtype=np.int64))
    return np.concatenate(pieces)[header_lines:]


def load(path: str, records: int, data: np.ndarray, header_lines: int = 0):
    """The offsets in index file ``path`` as an int64 array, or None when it is missing or does
    not fit the shard ``data`` (uint8): not ``records + 1`` offsets, not ending at the shard's
    end, not increasing, or one that does not follow a newline (the first, with no header:
    not 0). The caller then scans the shard."""
    try:
        if os.path.getsize(path) != (records + 1) * DTYPE.itemsize:
            return None
        offsets = np.fromfile(path, dtype=DTYPE).astype(np.int64)
    except (OSError, ValueError):
        return None
    if offsets.size != records + 1 or int(offsets[-1]) != data.size:
        return None
    if offsets.size > 1 and not (offsets[1:] > offsets[:-1]).all():
        return None
    inner = offsets[1:-1] if header_lines == 0 else offsets[:-1]
    if (header_lines == 0 and offsets[0] != 0) or (inner.size and (
            inner.min() < 1 or not (data[inner - 1] == _NL).all())):
        return None
    return offsets
