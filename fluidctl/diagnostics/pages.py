"""A rank's shared pages (``progress.<rank>``, ``steps.<rank>``) on the file system they are in.

A rank updates its counters with plain stores into a page; the launcher reads the page's file
with ``pread``. Where the diagnostics directory is in /dev/shm or on a local disk (one machine,
or each node's own agent), the page is the file mapped shared: the reader sees every store
at once. Where it is on a network file system (the hidden diagnostics directory in LOG_DIR of
the Slurm and mpirun backends, read by the launcher on another host), a shared mapping is not
coherent across hosts: NFS writes a dirty mapped page back when the kernel's writeback gets
to it (``vm.dirty_expire_centisecs``, 30 s by default), so the launcher would see the page
tens of seconds late, and some FUSE file systems refuse a writable shared mapping at all.
There the rank keeps the page in its own memory (an anonymous mapping, the same interface)
and a thread writes a copy of it to the file every ``PUBLISH_EVERY`` seconds while it changes,
with one ``pwrite`` of the whole page to a descriptor opened ``O_DSYNC`` (on NFS one
synchronous WRITE: the server has it when the call returns, and the launcher's next ``open``
sees it, NFS's close-to-open consistency).

Which file systems get the copy: ``PUBLISHED_FS`` (NFS, SMB, 9p, AFS, FUSE), read from
/proc/self/mountinfo; Lustre, GPFS and CephFS keep mapped pages coherent between clients
themselves. ``FLUIDCTL_DIAG_WRITE=pwrite`` (or ``mmap``) decides it where the guess is wrong.

Standard library only: imported by training processes.
"""
from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fluidctl.envs import DIAG_WRITE

PUBLISH_EVERY = 0.5     # seconds between copies of a changed page (the launcher reads every
                        # 0.25 s; its straggler windows span 0.75 s and more)
PUBLISHED_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "fuse")
MODES = ("mmap", "pwrite")


def mount_of(path: Path, mountinfo: str) -> Tuple[str, str]:
    """(mount point, file system type) of the mount holding ``path``, from the text of
    /proc/self/mountinfo (the longest mount point that contains it; ('', '') if none)."""
    best = ("", "")
    target = str(path)
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split()[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def published(fstype: str) -> bool:
    """True for a file system whose shared mappings other hosts do not see promptly."""
    return fstype.split(".")[0] in PUBLISHED_FS


def mode_for(directory: Path, environ=None) -> str:
    """``mmap`` or ``pwrite`` for pages in ``directory``: FLUIDCTL_DIAG_WRITE if set, else by
    the directory's file system type."""
    chosen = (os.environ if environ is None else environ).get(DIAG_WRITE, "").strip()
    if chosen in MODES:
        return chosen
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "mmap"
    return "pwrite" if published(mount_of(Path(os.path.realpath(directory)), text)[1]) \
        else "mmap"


class PublishedPage(mmap.mmap):
    """A page in this process's memory (anonymous, shared with nobody) whose copy the
    publisher thread writes to its file (``fd``); ``close`` writes the last state first."""
    fd: int = -1
    last: bytes = b""
    pid: int = -1               # the process whose page it is (a fork's copy is not)

    def publish(self) -> None:
        """Write the page to its file if it changed since the last copy (never raises: a
        page that cannot be written only goes unseen)."""
        if os.getpid() != self.pid:
            return
        try:
            now = self[:]
        except ValueError:          # closed meanwhile
            return
        if now != self.last:
            try:
                os.pwrite(self.fd, now, 0)
                self.last = now
            except OSError:
                pass

    def close(self) -> None:
        with _lock:             # not while the publisher writes it (its fd is closed here)
            if self in _pages:
                _pages.remove(self)
            if self.fd >= 0:
                self.publish()
                os.close(self.fd)
                self.fd = -1
        super().close()


_pages: List[PublishedPage] = []        # this process's, published by one thread
_lock = threading.Lock()
_thread: Optional[threading.Thread] = None


def _forget_in_child() -> None:
    """A forked child (a data loader's worker) has copies of the parent's pages: it must
    never write them over the parent's newer ones (and the lock may have been held)."""
    global _thread, _lock
    _pages.clear()
    _thread, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _publisher() -> None:
    while True:
        time.sleep(PUBLISH_EVERY)
        with _lock:
            for page in _pages:
                page.publish()


def open_published(path: Path, size: int) -> PublishedPage:
    """``size`` bytes whose copy is written to ``path`` (made, zero-filled) every
    PUBLISH_EVERY seconds while they change."""
    global _thread
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DSYNC", 0), 0o600)
    try:
        os.ftruncate(fd, size)
        page = PublishedPage(-1, size)
    except BaseException:
        os.close(fd)
        raise
    page.fd, page.last, page.pid = fd, bytes(size), os.getpid()
    with _lock:
        _pages.append(page)
        if _thread is None:
            _thread = threading.Thread(target=_publisher, name="fluidctl-pages", daemon=True)
            _thread.start()
    return page


def map_shared(path: Path, size: int, mode: Optional[str] = None) -> mmap.mmap:
    """``size`` bytes of the file at ``path`` (made, zero-filled) that the launcher reads:
    the file mapped shared, or a published copy (``mode_for`` its directory)."""
    if (mode or _mode(path.parent)) == "pwrite":
        return open_published(path, size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


_modes: Dict[Path, str] = {}


def _mode(directory: Path) -> str:
    """``mode_for``, once per directory (a rank maps two pages in one)."""
    if directory not in _modes:
        _modes[directory] = mode_for(directory)
    return _modes[directory]
