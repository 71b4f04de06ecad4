"""Workspace sync over SFTP: send a local tree to a node, only the files that changed.

Its own module because it is a policy over a connection (what to exclude, how to decide a file
changed, how to write it atomically), not part of connecting or running commands: ``cluster
sync`` and shard distribution use it; the SFTP primitives it needs are on ``SSHNode``.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from fluidctl.backends.ssh import SSHNode

DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", ".pytest_cache")


@dataclass
class FileToSend:
    local: Path
    remote: str
    size: int
    mtime: float
    mode: int


@dataclass
class SyncPlan:
    remote_dir: str
    send: List[FileToSend] = field(default_factory=list)
    unchanged: int = 0

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.send)


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    """rsync-like: a pattern matches the relative path or any one of its components."""
    parts = rel.split("/")
    return any(fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts)
               for p in patterns)


def local_files(source: Path, excludes: Sequence[str]) -> List[Tuple[str, Path]]:
    """(relative posix path, path) of every regular file under ``source`` (or source itself)."""
    if source.is_file():
        return [(source.name, source)]
    files = []
    for root, dirs, names in os.walk(source):
        rel_root = Path(root).relative_to(source).as_posix()
        rel_root = "" if rel_root == "." else rel_root
        dirs[:] = sorted(d for d in dirs if not excluded(posixpath.join(rel_root, d), excludes))
        for name in sorted(names):
            rel = posixpath.join(rel_root, name) if rel_root else name
            path = Path(root) / name
            if not excluded(rel, excludes) and path.is_file():
                files.append((rel, path))
    return files


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def plan_sync(node: SSHNode, source: Path, remote_dir: str,
              excludes: Sequence[str] = DEFAULT_EXCLUDES, compare: str = "mtime") -> SyncPlan:
    """What must be sent: files missing remotely or differing in size or mtime (``compare=
    'hash'``: in size or sha256, for trees whose mtimes are not kept)."""
    remote = node.remote_tree(remote_dir)
    plan = SyncPlan(remote_dir)
    same_size: List[FileToSend] = []
    for rel, path in local_files(source, excludes):
        st = path.stat()
        item = FileToSend(path, posixpath.join(remote_dir, rel), st.st_size, st.st_mtime,
                          stat.S_IMODE(st.st_mode))
        attrs = remote.get(rel)
        if attrs is None or attrs.st_size != st.st_size:
            plan.send.append(item)
        elif compare == "hash":
            same_size.append(item)
        elif int(attrs.st_mtime or 0) != int(st.st_mtime):
            plan.send.append(item)
        else:
            plan.unchanged += 1
    if same_size:
        digests = node.remote_sha256([f.remote for f in same_size])
        for item in same_size:
            if digests.get(item.remote) == sha256_file(item.local):
                plan.unchanged += 1
            else:
                plan.send.append(item)
    return plan


def send_files(node: SSHNode, plan: SyncPlan,
               on_bytes: Optional[Callable[[int], None]] = None) -> None:
    """Write each file to a temporary name, then rename it into place (a reader never sees a
    half-written file), keeping the local mtime and mode."""
    known: set = set()
    node.makedirs(plan.remote_dir, known)
    for item in plan.send:
        node.makedirs(posixpath.dirname(item.remote), known)
        tmp = f"{item.remote}.fluidctl-{os.getpid()}-{threading.get_ident()}.tmp"
        last = [0]

        def progress(done, _total, last=last):
            if on_bytes:
                on_bytes(done - last[0])
            last[0] = done
        node.sftp.put(str(item.local), tmp, callback=progress, confirm=True)
        node.sftp.chmod(tmp, item.mode)
        node.sftp.utime(tmp, (item.mtime, item.mtime))
        node.sftp.posix_rename(tmp, item.remote)
