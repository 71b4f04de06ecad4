"""Writing a shard: byte ranges copied by the kernel (copy_file_range, then sendfile, then plain
writes), each range read once through a reused buffer for the record count and the digest."""
from __future__ import annotations

import errno
import os
import threading
from typing import List, Optional, Tuple

from fluidctl.errors import UsageError
from fluidctl.runtime import digest
from fluidctl.sharding import tuning
from fluidctl.sharding.options import Progress
from fluidctl.sharding.parallel import _Stopped
from fluidctl.sharding.scan import NEWLINE, count_newlines


_FALLBACK_ERRNOS = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF,
                    errno.ETXTBSY, errno.EPERM}


class Copier:
    """Copies file ranges with the fastest call the two file systems allow; remembers a refusal
    so a fallback is tried once, not per chunk."""

    first_choice = "copy_file_range"        # then "sendfile", then "write"

    def __init__(self):
        self.mode = self.first_choice
        if self.mode == "copy_file_range" and not hasattr(os, "copy_file_range"):
            self.mode = "sendfile"
        self._lock = threading.Lock()

    def _downgrade(self, failed: str) -> None:
        with self._lock:
            if self.mode == failed:
                self.mode = "sendfile" if failed == "copy_file_range" else "write"

    def copy(self, fin: int, fout: int, offset: int, count: int, buffer: Optional[memoryview]):
        """Copy ``count`` bytes at ``offset`` of ``fin`` to ``fout``'s position. ``buffer``, when
        given, already holds those bytes (read for hashing): the plain-write fallback uses it."""
        while count > 0:
            mode = self.mode
            try:
                if mode == "copy_file_range":
                    n = os.copy_file_range(fin, fout, count, offset)
                elif mode == "sendfile":
                    n = os.sendfile(fout, fin, offset, count)
                else:
                    if buffer is None:
                        buffer = memoryview(os.pread(fin, count, offset))
                    n = os.write(fout, buffer[:count])
            except OSError as exc:
                if mode != "write" and exc.errno in _FALLBACK_ERRNOS:
                    self._downgrade(mode)
                    continue
                raise
            if n == 0:
                raise UsageError("an input file shrank while being sharded",
                                 "do not modify the inputs while shard-data runs")
            offset += n
            count -= n
            if buffer is not None:
                buffer = buffer[n:]


class ShardWriter:
    """One output shard: bytes appended through here are counted (records) and hashed with
    ``checksum`` (a :mod:`fluidctl.runtime.digest` algorithm, or "none")."""

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

    def _account(self, data: memoryview) -> None:
        n = len(data)
        if not n:
            return
        if self.hasher is not None:
            self.hasher.update(data)
        new = count_newlines(data)
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

    def copy_range(self, copier: Copier, path: str, start: int, end: int,
                   stop: threading.Event) -> None:
        """Append bytes [start, end) of ``path``: each 1 MiB is read once for the count and
        digest (from the page cache) and copied by the kernel."""
        buf = bytearray(min(tuning.BLOCK, max(1, end - start)))
        fin = os.open(path, os.O_RDONLY)
        try:
            pos = start
            while pos < end:
                if stop.is_set():
                    raise _Stopped()
                n = min(tuning.BLOCK, end - pos)
                if os.preadv(fin, [memoryview(buf)[:n]], pos) != n:
                    raise UsageError(f"input {path} shrank while being sharded",
                                     "do not modify the inputs while shard-data runs")
                view = memoryview(buf)[:n]
                self._account(view)
                copier.copy(fin, self.fd, pos, n, view)
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
