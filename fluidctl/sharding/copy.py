"""Writing a shard, and tallying what the manifest says of it (size, records, digest).

The plain path (``shard-data`` without --shuffle) does the two side by side on separate
threads: one thread appends the shard's byte ranges with ``copy_file_range`` -- a single copy
inside the kernel (a reflink on XFS/btrfs, a server-side copy on NFS), the GIL released -- while
another reads the same ranges, a cache-sized piece at a time into a reused buffer, and hashes
and counts them (xxhash and StringZilla hold the GIL, so this side is the one that needs it).
This beat reading each piece once and then writing, hashing and counting it on the same thread
(docs/shard-data.md has the figures): those threads waited on each other (the hash and the
count hold the GIL, and two SMT vCPUs share their vector units). Where the kernel cannot copy between the two files (EXDEV, a
file system without it) the append falls back to pread/write.

Other writers (--shuffle's records, --equalize pad) tally and write each piece together:
``write``/``copy_range``."""
from __future__ import annotations

import errno
import os

from fluidctl.errors import UsageError
from fluidctl import digest
from fluidctl.sharding import tuning
from fluidctl.sharding.options import Progress
from fluidctl.sharding.parallel import _Stopped
from fluidctl.sharding.scan import NEWLINE, count_newlines

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from fluidctl.sharding.parallel import StopFlag
    from typing import List, Optional, Tuple

# copy_file_range's "not between these two files": fall back to reading and writing
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def _shrank(path: str) -> UsageError:
    return UsageError(f"input {path} shrank while being sharded",
                      "do not modify the inputs while shard-data runs")


class ShardWriter:
    """One output shard. ``write``/``copy_range`` append and tally; ``append``/``append_range``
    only append and ``tally``/``tally_range`` only tally, so that two threads can do the two
    halves of one shard at once (the appending thread alone touches the file, the tallying one
    alone the counts). The file is created by ``create`` (or the first append)."""

    def __init__(self, path: str, checksum: str, progress: Progress):
        self.path = path
        self.algorithm = None if checksum == "none" else checksum
        self.hasher = digest.new(checksum) if self.algorithm else None
        self.fd = -1
        self.progress = progress
        self.bytes = 0
        self.newlines = 0
        self.last_byte = NEWLINE
        # (start, end, newlines) of every piece tallied: --equalize pad finds records from
        # these counts and reads only the pieces its picks fall in.
        self.pieces: List[Tuple[int, int, int]] = []
        self._scratch: Optional[bytearray] = None      # count_newlines' table output

    def create(self) -> None:
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)

    # -- tallying ---------------------------------------------------------------------------

    def tally(self, data) -> None:
        """Count and hash ``data`` as the shard's next bytes (without writing them)."""
        data = memoryview(data).cast("B")
        n = len(data)
        if not n:
            return
        if self.hasher is not None:
            self.hasher.update(data)
        if self._scratch is None or len(self._scratch) < n:
            self._scratch = bytearray(max(n, tuning.COPY_BLOCK))
        new = count_newlines(data, self._scratch)
        self.newlines += new
        self.last_byte = data[n - 1]
        self.pieces.append((self.bytes, self.bytes + n, new))
        self.bytes += n
        self.progress.advance(n, new)

    def tally_range(self, path: str, start: int, end: int, stop: StopFlag) -> None:
        """Tally bytes [start, end) of ``path``, read a cache-sized piece at a time."""
        for piece in _pieces(path, start, end, stop):
            self.tally(piece)

    # -- appending --------------------------------------------------------------------------

    def append(self, data) -> None:
        """Write ``data`` at the end of the shard (without tallying it)."""
        self.create()
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self.fd, view):]

    def append_range(self, path: str, start: int, end: int, stop: StopFlag) -> None:
        """Append bytes [start, end) of ``path`` (without tallying them), copied by the kernel
        where it can."""
        self.create()
        pos = start
        if hasattr(os, "copy_file_range"):
            fin = os.open(path, os.O_RDONLY)
            try:
                while pos < end:
                    if stop.is_set():
                        raise _Stopped()
                    try:
                        n = os.copy_file_range(fin, self.fd, min(tuning.KERNEL_COPY_BLOCK,
                                                                 end - pos), pos)
                    except OSError as exc:
                        if exc.errno not in _NO_KERNEL_COPY:
                            raise
                        break                        # the rest through a buffer
                    if n == 0:
                        raise _shrank(path)
                    pos += n
            finally:
                os.close(fin)
        for piece in _pieces(path, pos, end, stop):
            self.append(piece)

    # -- both -------------------------------------------------------------------------------

    def write(self, data) -> None:
        self.tally(data)
        self.append(data)

    def copy_range(self, path: str, start: int, end: int, stop: StopFlag) -> None:
        """Append and tally bytes [start, end) of ``path`` (which may be this shard's own file:
        its bytes are read below ``end`` while the appends go beyond), each piece read once."""
        for piece in _pieces(path, start, end, stop):
            self.write(piece)

    @property
    def records(self) -> int:
        return self.newlines + (1 if self.bytes and self.last_byte != NEWLINE else 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def digest(self) -> Optional[str]:
        return self.hasher.hexdigest() if self.hasher is not None else None


def _pieces(path: str, start: int, end: int, stop: StopFlag):
    """Bytes [start, end) of ``path`` as memoryviews of one reused buffer (each valid until the
    next is asked for)."""
    if start >= end:
        return
    size = min(tuning.COPY_BLOCK, end - start)
    buf = memoryview(bytearray(size))
    fin = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            if stop.is_set():
                raise _Stopped()
            n = min(size, end - pos)
            if os.preadv(fin, [buf[:n]], pos) != n:
                raise _shrank(path)
            yield buf[:n]
            pos += n
    finally:
        os.close(fin)
