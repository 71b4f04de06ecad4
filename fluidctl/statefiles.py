"""How fluidctl reads and writes its state files (pid files, records, the ledger, job state):
never following a link or blocking on a FIFO where a file should be, never reading an
unbounded amount, never leaving half a file behind. Where each file lives is paths.py's."""
from __future__ import annotations

import os
from typing import Optional


class StateFileError(OSError):
    """A state file that is not a regular file of a sane size (a FIFO, a device, a directory):
    its message names the path and what it is."""


def open_state_file(path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path``, which must be a regular file: opened with O_NONBLOCK, so a
    FIFO or a device there cannot block open() (as OpenSSH opens key files), then checked
    with fstat. FileNotFoundError when absent; StateFileError when not a regular file."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        import errno
        if exc.errno == errno.ENXIO:        # a FIFO with no reader, opened for writing
            raise StateFileError(f"{path} is not a regular file (a FIFO or a device)") from None
        raise
    try:
        import stat
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a file")
            raise StateFileError(f"{path} is not a regular file ({what})")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_state_file(path, limit: int = 16 << 20) -> bytes:
    """The bytes of state file ``path`` (open_state_file's checks), at most ``limit`` of them:
    a larger file is StateFileError, not a read of whatever it holds."""
    fd = open_state_file(path)
    try:
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise StateFileError(f"{path} holds more than {limit} bytes")
    finally:
        os.close(fd)


def write_atomic(path, data, mode: Optional[int] = None) -> None:
    """Write ``data`` (str as UTF-8, or bytes) to ``path`` so that a reader sees the old file
    or the whole new one, never half of it, even after a crash: a temporary name in the same
    directory, fsync, rename. ``mode``: the file's exact permissions (else as open() makes
    them), set before any byte is written, so a private file is never readable by others."""
    path = os.fspath(path)
    where, name = os.path.split(path)
    tmp = os.path.join(where, f".{name}.{os.getpid()}.tmp")
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
