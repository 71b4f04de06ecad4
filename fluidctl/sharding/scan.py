"""Looking into a file without copying it: the next or previous newline around an offset, and
newline counts over a byte range (numpy over a reused buffer). Planning and equalizing are built
on these.

numpy counts a run's newlines only when it is already loaded: the engine imports it for runs of
``tuning.NUMPY_RUN_FROM`` bytes or more (and --shuffle / --equalize need it anyway). Importing
it costs about 90 ms of CPU, while ``bytes.count`` costs 0.62 s per GiB against numpy's 0.09
(which also releases the GIL, so shards count in parallel): below about 128 MiB the import is
the dearer part.
"""
from __future__ import annotations

import os
import sys

from fluidctl.sharding import tuning

NEWLINE = 10


def count_newlines(data) -> int:
    """Newline bytes in a buffer (bytes, bytearray or memoryview of bytes)."""
    np = sys.modules.get("numpy")
    if np is None or len(data) < tuning.NUMPY_FROM:
        if isinstance(data, memoryview) and isinstance(data.obj, (bytes, bytearray)) \
                and len(data) == len(data.obj):
            return data.obj.count(b"\n")       # the whole buffer: no copy
        return bytes(data).count(b"\n")
    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == NEWLINE))


def find_newline(path: str, start: int, end: int) -> int:
    """Offset of the first newline in bytes [start, end) of a file, or -1; reads 64 KiB at a
    time, so finding a cut costs a few KiB of reading."""
    with open(path, "rb", buffering=0) as f:
        pos = start
        while pos < end:
            f.seek(pos)
            chunk = f.read(min(tuning.SNIFF, end - pos))
            if not chunk:
                break
            at = chunk.find(b"\n")
            if at >= 0:
                return pos + at
            pos += len(chunk)
    return -1


def rfind_newline(path: str, start: int, end: int) -> int:
    """Offset of the last newline in bytes [start, end) of a file, or -1."""
    with open(path, "rb", buffering=0) as f:
        hi = end
        while hi > start:
            lo = max(start, hi - tuning.SNIFF)
            f.seek(lo)
            at = f.read(hi - lo).rfind(b"\n")
            if at >= 0:
                return lo + at
            hi = lo
    return -1


def _count_range(path: str, start: int, end: int, limit: int) -> int:
    import numpy as np
    buf = bytearray(tuning.BLOCK)
    arr = np.frombuffer(buf, np.uint8)
    count = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end and count < limit:
            n = os.preadv(fd, [memoryview(buf)[:min(tuning.BLOCK, end - start)]], start)
            if n <= 0:
                break
            count += int(np.count_nonzero(arr[:n] == NEWLINE))
            start += n
    finally:
        os.close(fd)
    return count


def _offset_after_newline(path: str, start: int, end: int, j: int) -> int:
    """The offset just past the j-th newline (0-based) in bytes [start, end) of a file (which
    has more than j newlines there)."""
    import numpy as np
    buf = bytearray(tuning.BLOCK)
    arr = np.frombuffer(buf, np.uint8)
    seen = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            n = os.preadv(fd, [memoryview(buf)[:min(tuning.BLOCK, end - pos)]], pos)
            if n <= 0:
                break
            is_newline = arr[:n] == NEWLINE
            count = int(np.count_nonzero(is_newline))
            if seen + count > j:
                return pos + int(np.flatnonzero(is_newline)[j - seen]) + 1
            seen += count
            pos += n
    finally:
        os.close(fd)
    raise ValueError(f"{path} has only {seen} newlines in [{start}, {end})")
