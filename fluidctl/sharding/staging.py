"""Nothing half-written: output is built in a hidden directory next to OUT_DIR and renamed into
place at the end, or removed on any error; disk-space checks and OSErrors turned into one-line
messages live here too."""
from __future__ import annotations

import errno
import os

from fluidctl import sigs
from fluidctl.errors import FluidctlError, UsageError
from fluidctl.units import human_bytes
from fluidctl.sharding.inputs import _inside

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import List, Optional


class Staging:
    """A hidden directory next to OUT_DIR that becomes OUT_DIR at the end, or disappears."""

    def __init__(self, out_dir: str):
        self.out_dir = os.path.abspath(out_dir)
        self.tmp = ""
        self.created: List[str] = []
        self.committed = False

    def __enter__(self) -> "Staging":
        parent = os.path.dirname(self.out_dir)
        missing = []
        p = parent
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        # Ctrl-C / SIGTERM wait while a directory exists that self does not know yet (inside
        # mkdtemp, or between os.mkdir and the append): raised there, __exit__ would never run
        # and the directory would stay. They are delivered in the try below, which cleans up.
        blocked = sigs.pthread_sigmask(sigs.SIG_BLOCK, {sigs.SIGINT, sigs.SIGTERM})
        try:
            for d in reversed(missing):
                os.mkdir(d)
                self.created.append(d)
            _collect_stale(parent, os.path.basename(self.out_dir))
            self.tmp = _mkdtemp(parent, f".{os.path.basename(self.out_dir)}.{_owner()}.",
                                ".partial")
        except OSError as exc:
            sigs.pthread_sigmask(sigs.SIG_SETMASK, blocked)
            self._cleanup()
            raise UsageError(f"cannot write the output {self.out_dir}: {exc.strerror}",
                             "choose a writable -o") from None
        try:        # a signal here (the directory exists, __exit__ will not run) removes it
            sigs.pthread_sigmask(sigs.SIG_SETMASK, blocked)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(self.tmp, 0o777 & ~mask)
            self.work = os.path.join(self.tmp, ".work")
            os.mkdir(self.work)
        except BaseException:
            self._cleanup()
            raise
        return self

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def commit(self, force: bool = True) -> None:
        """Rename the staging directory to OUT_DIR. Without ``force`` an OUT_DIR that appeared
        meanwhile (another run's) is never replaced: the rename itself refuses (atomically),
        this run's output is removed and the error is one line."""
        try:
            os.rmdir(self.work)               # empty unless gzip spools or a shuffle used it
        except OSError:
            _rmtree(self.work, ignore_errors=False)
        if not force:
            if not _rename_noreplace(self.tmp, self.out_dir):
                raise UsageError(f"output {self.out_dir} appeared while this run wrote it "
                                 "(another shard-data run?); it was left as it is",
                                 "pass --force to replace it, or choose another -o")
            self.committed = True
            return
        old = None
        if os.path.lexists(self.out_dir):
            old = _mkdtemp(os.path.dirname(self.out_dir), f".{os.path.basename(self.out_dir)}.",
                           ".old")
            os.rename(self.out_dir, os.path.join(old, "previous"))
        os.rename(self.tmp, self.out_dir)
        self.committed = True
        if old:
            _rmtree(old)

    def _cleanup(self) -> None:
        if self.tmp:
            _rmtree(self.tmp)
        for d in reversed(self.created):
            try:
                os.rmdir(d)
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self._cleanup()


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: str, dst: str) -> bool:
    """rename(src, dst) unless dst exists (False then), in one step: renameat2 with
    RENAME_NOREPLACE; where the kernel or file system lacks it, mkdir(dst) claims the name
    (atomic) and the rename replaces that empty directory."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                     _RENAME_NOREPLACE) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), dst)
    try:
        os.mkdir(dst)
    except FileExistsError:
        return False
    os.rename(src, dst)
    return True


def _start_time(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat's 22nd field), or
    None when there is no such process. Read from /proc rather than through psutil: importing
    psutil was a tenth of a small shard-data run's start-up."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner() -> str:
    """``pid.start`` of this process: a staging directory names its owner, so a later run can
    tell one left by a killed run (owner gone) from one still being written."""
    return f"{os.getpid()}.{_start_time(os.getpid()) or 0}"


def _collect_stale(parent: str, base: str) -> None:
    """Remove ``.BASE.PID.START.*.partial`` directories whose owner is gone (SIGKILLed runs)."""
    head = f".{base}."
    try:
        names = [n for n in os.listdir(parent) if n.startswith(head) and n.endswith(".partial")]
    except OSError:
        return
    for name in names:
        pid, _, rest = name[len(head):].partition(".")
        start = rest.partition(".")[0]
        if not (pid.isdigit() and start.isdigit()):
            continue
        alive = _start_time(int(pid)) == int(start)
        if not alive:
            _rmtree(os.path.join(parent, name))


def _mkdtemp(parent: str, prefix: str, suffix: str) -> str:
    """A new directory PARENT/PREFIX<random>SUFFIX, mode 0700, as tempfile.mkdtemp makes it
    (tempfile and the shutil below cost a small run a tenth of its start-up)."""
    for _ in range(100):
        path = os.path.join(parent, f"{prefix}{os.urandom(5).hex()}{suffix}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused name for a staging directory", parent)


def _rmtree(path: str, ignore_errors: bool = True) -> None:
    """Remove a directory tree through directory descriptors, never following a symlink
    (O_NOFOLLOW at every level, as shutil.rmtree does); shutil, whose imports (bz2, lzma,
    fnmatch) a small run is spared, only where that meets an error, to finish or report it."""
    try:
        _remove_tree(path)
    except OSError:
        import shutil
        shutil.rmtree(path, ignore_errors=ignore_errors)


def _remove_tree(path: str, dir_fd: Optional[int] = None) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as it:
            entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in it]
        for name, is_dir in entries:
            if is_dir:
                _remove_tree(name, fd)
            else:
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path, dir_fd=dir_fd)


def _io_error(exc: OSError, out_dir: str, staging: str) -> FluidctlError:
    """An OSError met while sharding, as one line: disk full, unwritable output and unreadable
    input are the user's to fix (exit 2); anything else is reported with its file (exit 1)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(f"disk full while writing {out_dir}",
                          "free some space or choose another -o")
    writing = not exc.filename or _inside(str(exc.filename), staging)
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        if writing:
            return UsageError(f"cannot write {out_dir}: {exc.strerror}", "choose a writable -o")
        return UsageError(f"cannot read {exc.filename}: {exc.strerror}",
                          "check the input's permissions")
    return FluidctlError(f"{exc.filename or out_dir}: {exc.strerror or exc}",
                         "check the disk and the inputs", exit_code=1)


def _check_space(directory: str, out_dir: str, needed: int) -> None:
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < needed:
        raise UsageError(
            f"not enough space for {out_dir}: {human_bytes(needed)} needed, "
            f"{human_bytes(st.f_bavail * st.f_frsize)} free", "free some space or choose another -o")
