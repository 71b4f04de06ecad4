"""Workspace sync over SFTP: send a local tree to a node, only the files that changed.

``cluster sync`` goes through ``fluidctl.remote.push`` (OpenSSH, one stream) and comes here
only when that cannot reach a node; ``shard-data --to-hosts`` sends its shards with
``send_files``. ``walk`` and ``local_files`` (what a sync sends) serve both.

Its own module because it is a policy over a connection (what to exclude, how to decide a file
changed, how to write it atomically), not part of connecting or running commands: ``cluster
sync`` and shard distribution use it; the SFTP primitives it needs are on ``SSHNode``.
"""
from __future__ import annotations

import os
import posixpath
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: paramiko, pathlib and typing stay off the start-up path
    from pathlib import Path
    from typing import Callable, List, Optional, Sequence, Tuple

    from fluidctl.remote.ssh import SSHNode

DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", ".pytest_cache")


class FileToSend:
    """One file of a plan: where it is here and goes there, its size, mtime and mode; ``link``:
    a symlink's target (it is sent as a symlink), else None."""
    __slots__ = ("local", "remote", "size", "mtime", "mode", "link")

    def __init__(self, local: Path, remote: str, size: int, mtime: float, mode: int):
        self.local, self.remote, self.size, self.mtime, self.mode = local, remote, size, mtime, mode
        self.link = None


class SyncPlan:
    """What a sync sends, and how many files were already there.
    (Plain classes, not dataclasses: importing dataclasses costs ``cluster sync`` CPU during
    its ssh handshakes, and this module lists its files.)"""

    def __init__(self, remote_dir: str, send: Optional[List[FileToSend]] = None,
                 unchanged: int = 0):
        self.remote_dir = remote_dir
        self.send = send if send is not None else []
        self.unchanged = unchanged
        self.vanished: List[str] = []       # files gone here before they could be sent

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.send)


def _matcher(patterns: Sequence[str]):
    """One compiled regex for every glob (fnmatch's own translation). re and fnmatch are
    imported here, only for patterns ``_name_tests`` cannot test by name alone."""
    if not patterns:
        return lambda text: False
    import fnmatch
    import re
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match


_GLOB = frozenset("*?[")


def _name_tests(patterns: Sequence[str]):
    """Split the patterns by how cheaply they can be tested: a literal name (``.git``) as set
    membership, ``*SUFFIX`` (``*.pyc``) as ``str.endswith``, anything else by regex. For the
    first two, matching a file's name is the same as matching its relative path (neither
    holds a ``/``, and fnmatch's ``*`` is anchored at the end), so the walk tests the name
    alone; only the rest is matched against both."""
    names, suffixes, others = set(), [], []
    for pattern in patterns:
        if "/" in pattern or _GLOB.intersection(pattern[1:]):
            others.append(pattern)
        elif pattern.startswith("*"):
            suffixes.append(pattern[1:])
        elif pattern[:1] in _GLOB:
            others.append(pattern)
        else:
            names.add(pattern)
    return names, tuple(suffixes), (_matcher(others) if others else None)


def _by_name(entry: os.DirEntry) -> str:
    return entry.name


def is_link(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode)


def safe_link(rel: str, target: str) -> bool:
    """Whether a symlink at ``rel`` (relative to the tree) pointing at ``target`` stays inside
    the tree, judged by its text as rsync's --safe-links does: not absolute, and no ``..``
    climbs above the tree's top."""
    if not target or target.startswith("/"):
        return False
    depth = rel.count("/")              # directories above the link, inside the tree
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def walk(source: Path, excludes: Sequence[str],
         warn: Optional[Callable[[str], None]] = None) -> List[Tuple[str, str, os.stat_result]]:
    """(relative posix path, path, stat) of every regular file and symlink under ``source``
    (or source itself), sorted, skipping what ``excludes`` matches. A directory that matches is
    not entered, so a file's path and its own name are all that is left to check for it.

    Nothing outside the tree is ever listed: symlinks are listed as symlinks (their stat is
    lstat's; as rsync -a keeps them), never followed, and one that points outside the tree
    (absolute, or climbing above it) is skipped, as are FIFOs, sockets and devices: ``warn``
    is told each one, by name.

    Each directory is read through a descriptor and its files are stat'ed relative to it
    (``fstatat``): the kernel resolves one name per file, not the whole path again, and
    ``cluster sync`` lists the tree while its ssh handshakes run on the same CPUs."""
    source = os.fspath(source)
    if os.path.isfile(source):
        return [(os.path.basename(source), source, os.stat(source))]
    names, suffixes, match = _name_tests(excludes)
    files: List[Tuple[str, str, os.stat_result]] = []
    append = files.append

    def visit(fd: int, rel_dir: str, path_dir: str) -> None:
        with os.scandir(fd) as it:
            entries = sorted(it, key=_by_name)
        for entry in entries:
            name = entry.name
            if name in names or (suffixes and name.endswith(suffixes)):
                continue
            rel = rel_dir + name
            if match and (match(rel) or match(name)):
                continue
            try:
                if entry.is_symlink():      # kept as a link, never followed
                    target = os.readlink(name, dir_fd=fd)
                    if safe_link(rel, target):
                        append((rel, path_dir + name, entry.stat(follow_symlinks=False)))
                    elif warn:
                        warn(f"skipped symlink {rel} -> {target}: it points outside the tree")
                elif entry.is_dir():
                    try:
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                    except OSError as exc:  # say which directory, not just its name
                        raise type(exc)(exc.errno, exc.strerror,
                                        path_dir + name) from None
                    try:
                        visit(sub, rel + "/", path_dir + name + "/")
                    finally:
                        os.close(sub)
                elif entry.is_file():
                    append((rel, path_dir + name, entry.stat()))
                elif warn:
                    warn(f"skipped {rel}: {_special_kind(entry)}, not a regular file")
            except FileNotFoundError:       # vanished while listed
                continue

    top = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        visit(top, "", source.rstrip("/") + "/")
    finally:
        os.close(top)
    return files


def _special_kind(entry: os.DirEntry) -> str:
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return "a special file"
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "a special file")


def local_files(source: Path, excludes: Sequence[str]) -> List[Tuple[str, Path]]:
    """(relative posix path, path) of every regular file under ``source`` (or source itself)."""
    from pathlib import Path
    return [(rel, Path(path)) for rel, path, _ in walk(source, excludes)]


def plan_sync(node: SSHNode, source: Path, remote_dir: str,
              excludes: Sequence[str] = DEFAULT_EXCLUDES, compare: str = "mtime") -> SyncPlan:
    """What must be sent: files missing remotely or differing in size or mtime (``compare=
    'hash'``: in size or sha256, for trees whose mtimes are not kept)."""
    from pathlib import Path
    remote = node.remote_tree(remote_dir)
    plan = SyncPlan(remote_dir)
    same_size: List[FileToSend] = []
    for rel, path, st in walk(source, excludes):
        item = FileToSend(Path(path), posixpath.join(remote_dir, rel), st.st_size, st.st_mtime,
                          stat.S_IMODE(st.st_mode))
        attrs = remote.get(rel)
        if is_link(st):             # sent as a link: the same target there, or sent again
            item.link = os.readlink(path)
            item.size = 0
            if not (attrs is not None and stat.S_ISLNK(attrs.st_mode or 0)
                    and node.sftp.readlink(item.remote) == item.link):
                plan.send.append(item)
            else:
                plan.unchanged += 1
            continue
        if attrs is None or not stat.S_ISREG(attrs.st_mode or 0) or attrs.st_size != st.st_size:
            plan.send.append(item)
        elif compare == "hash":
            same_size.append(item)
        elif int(attrs.st_mtime or 0) != int(st.st_mtime):
            plan.send.append(item)
        else:
            plan.unchanged += 1
    if same_size:
        from fluidctl.digest import file_digest
        digests = node.remote_sha256([f.remote for f in same_size])
        for item in same_size:
            if digests.get(item.remote) == file_digest(str(item.local), "sha256"):
                plan.unchanged += 1
            else:
                plan.send.append(item)
    return plan


def send_files(node: SSHNode, plan: SyncPlan,
               on_bytes: Optional[Callable[[int], None]] = None) -> None:
    """Write each file to a temporary name, then rename it into place (a reader never sees a
    half-written file), keeping the local mtime and mode."""
    import threading
    known: set = set()
    node.makedirs(plan.remote_dir, known)
    for item in plan.send:
        node.makedirs(posixpath.dirname(item.remote), known)
        tmp = f"{item.remote}.fluidctl-{os.getpid()}-{threading.get_ident()}.tmp"
        if item.link is not None:
            node.sftp.symlink(item.link, tmp)
            node.sftp.posix_rename(tmp, item.remote)
            continue
        last = [0]

        def progress(done, _total, last=last):
            if on_bytes:
                on_bytes(done - last[0])
            last[0] = done
        try:
            with open(item.local, "rb") as local:
                node.sftp.putfo(local, tmp, file_size=item.size, callback=progress,
                                confirm=True)
        except FileNotFoundError as exc:
            if exc.filename is None or os.path.exists(item.local):
                raise
            plan.vanished.append(str(item.local))   # deleted here meanwhile: the rest goes on
            continue
        node.sftp.chmod(tmp, item.mode)
        node.sftp.utime(tmp, (item.mtime, item.mtime))
        node.sftp.posix_rename(tmp, item.remote)
