"""Looking into a file without copying it: the next or previous newline around an offset, and
newline counts over a byte range. Planning and equalizing are built on these.

Counting newlines is the costliest part of writing a shard after the copy itself: CPython's
``bytes.count`` of one byte is a scalar loop (holding the GIL) and numpy's is fast but slow to
import, more than a 256 MiB run's whole copy. StringZilla (one small SIMD extension, quick to
import) maps each byte through a 256-entry table (newline -> 1, else 0) into a scratch buffer
and sums the bytes, several times faster than ``bytes.count``, without numpy.
Without the package (or without a scratch buffer) numpy counts when it is already loaded, else
``bytes.count``: every path gives the same number.
"""
from __future__ import annotations

import os
import sys

from fluidctl.sharding import tuning

NEWLINE = 10
_TO_ONES = bytes(1 if b == NEWLINE else 0 for b in range(256))    # newline -> 1, else 0
_sz = None                          # the stringzilla module, False once it failed to import
_counted_without = 0                # bytes counted before StringZilla was wanted


def _stringzilla(n: int):
    """The stringzilla module, imported once ``tuning.STRINGZILLA_FROM`` bytes were counted
    without it (so a small file never pays its import); None before, False without it."""
    global _sz, _counted_without
    if _sz is None:
        _counted_without += n
        if _counted_without < tuning.STRINGZILLA_FROM:
            return None
        try:
            import stringzilla
            _sz = stringzilla
        except ImportError:
            _sz = False
    return _sz


def count_newlines(data, scratch=None) -> int:
    """Newline bytes in a buffer (bytes, bytearray or memoryview of bytes). ``scratch``, a
    writable buffer at least as long, lets StringZilla count without allocating."""
    n = len(data)
    if not n:
        return 0
    sz = _stringzilla(n)
    if sz and scratch is not None and len(scratch) >= n:
        ones = memoryview(scratch)[:n]
        sz.translate(data, _TO_ONES, out=ones)
        return sz.bytesum(ones)
    np = sys.modules.get("numpy")
    if np is not None and n >= tuning.NUMPY_FROM:
        return int(np.count_nonzero(np.frombuffer(data, np.uint8) == NEWLINE))
    if isinstance(data, memoryview) and isinstance(data.obj, (bytes, bytearray)) \
            and n == len(data.obj):
        return data.obj.count(b"\n")       # the whole buffer: no copy
    return bytes(data).count(b"\n")


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
    """Newlines in bytes [start, end) of a file, counting no further than ``limit`` (in whole
    blocks), with count_newlines: no numpy."""
    view = memoryview(bytearray(tuning.BLOCK))
    scratch = bytearray(tuning.BLOCK)
    count = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end and count < limit:
            n = os.preadv(fd, [view[:min(tuning.BLOCK, end - start)]], start)
            if n <= 0:
                break
            count += count_newlines(view[:n], scratch)
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
