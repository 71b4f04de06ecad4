"""Writing a shard: each byte range is read once, a cache-sized piece at a time, into a reused
buffer, and the piece is written, hashed and counted while it is still in the CPU's cache.

Why not copy_file_range or sendfile: the record count and the digest need every byte in this
process anyway, so a kernel-side copy would be a second pass over memory (the previous engine
did both, and was slower for it). The writes and the hashes release the GIL; the count holds it
for 0.09 s per GiB (see :mod:`fluidctl.sharding.scan`), so a thread per core keeps both cores
busy."""
from __future__ import annotations

import os
import threading
from typing import List, Optional, Tuple

from fluidctl.errors import UsageError
from fluidctl import digest
from fluidctl.sharding import tuning
from fluidctl.sharding.options import Progress
from fluidctl.sharding.parallel import _Stopped
from fluidctl.sharding.scan import NEWLINE, count_newlines


class ShardWriter:
    """One output shard: bytes appended through here are counted (records) and hashed with
    ``checksum`` (a :mod:`fluidctl.digest` algorithm, or "none")."""

    def __init__(self, path: str, checksum: str, progress: Progress):
        self.path = path
        self.algorithm = None if checksum == "none" else checksum
        self.hasher = digest.new(checksum) if self.algorithm else None
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.progress = progress
        self.bytes = 0
        self.newlines = 0
        self.last_byte = NEWLINE
        # (start, end, newlines) of every piece written: --equalize pad finds records from
        # these counts and reads only the pieces its picks fall in.
        self.pieces: List[Tuple[int, int, int]] = []
        self._scratch: Optional[bytearray] = None      # count_newlines' table output

    def _account(self, data: memoryview) -> None:
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

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self._account(view)
        while view:
            view = view[os.write(self.fd, view):]

    def copy_range(self, path: str, start: int, end: int, stop: threading.Event) -> None:
        """Append bytes [start, end) of ``path`` (which may be this shard's own file: its bytes
        are read below ``end`` while the appends go beyond), through one reused buffer."""
        size = min(tuning.COPY_BLOCK, max(1, end - start))
        buf = memoryview(bytearray(size))
        fin = os.open(path, os.O_RDONLY)
        try:
            pos = start
            while pos < end:
                if stop.is_set():
                    raise _Stopped()
                n = min(size, end - pos)
                if os.preadv(fin, [buf[:n]], pos) != n:
                    raise UsageError(f"input {path} shrank while being sharded",
                                     "do not modify the inputs while shard-data runs")
                self.write(buf[:n])
                pos += n
        finally:
            os.close(fin)

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
