"""Pushing a local tree to a node through one OpenSSH process: ``cluster sync``'s transport.

``push(ssh_argv, source, remote_dir)`` starts ``ssh ... python3 -c <loader>`` and talks to a
small standard-library receiver (``RECEIVER``, sent over stdin: nothing is installed on the node,
which needs only ``python3``; neither fluidctl nor rsync). One round trip decides what to send,
then every file streams through the one connection:

1. fluidctl sends the receiver's code, then one JSON line: the remote directory, how to compare,
   and every local file as ``[relative path, size, mtime_ns, mode]``.
2. The receiver stats those paths only (never walks the remote tree) and answers one JSON line:
   the indices it needs (missing, another size, another mtime in whole seconds, as the SFTP
   path compares), or with ``compare="hash"`` the sha256 of every same-size file, which
   fluidctl compares with its own.
3. fluidctl streams each needed file as a 12-byte header (index, size) and its bytes (small
   files batched into large writes, large ones with ``sendfile``), then an end marker. The
   receiver writes each to a temporary name beside its target, sets mode and mtime (ns), and
   renames it into place: a reader never sees a half-written file, an interrupted push leaves
   no temporary file behind.
4. The receiver answers one JSON line: per-file errors (permission denied, disk full), if any.

Why OpenSSH and not paramiko's SFTP: ssh's C ciphers, no request/response round trip per file,
and no paramiko import (a quarter of a second) on the way. ``ssh_command`` builds the argv from
what the user wrote (OpenSSH reads the same ssh config); :class:`PushUnavailable` tells the
caller to fall back to SFTP (no ``ssh`` client here, no ``python3`` on the node).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

END = 0xFFFFFFFF
HEADER = struct.Struct(">IQ")            # file index, size
BATCH = 1 << 20                          # small files are gathered into writes this large
SENDFILE_FROM = 256 << 10                # files this large go through sendfile

RECEIVER = r'''
import hashlib, json, os, stat, struct, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
def reply(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()
req = json.loads(inp.readline())
root, files, compare = req["dir"], req["files"], req["compare"]
need, digests = [], {}
for i, (rel, size, mtime_ns, mode) in enumerate(files):
    path = os.path.join(root, rel)
    try:
        st = os.stat(path)
    except OSError:
        need.append(i)
        continue
    if st.st_size != size or not stat.S_ISREG(st.st_mode):
        need.append(i)
    elif compare == "hash":
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digests[i] = h.hexdigest()
    elif st.st_mtime_ns // 10**9 != mtime_ns // 10**9:   # whole seconds, as SFTP keeps them
        need.append(i)
reply({"need": need, "digests": digests})
errors, made, tmp = [], set(), None
buf = bytearray(1 << 20)
view = memoryview(buf)
try:
    while True:
        head = inp.read(12)
        if len(head) < 12:
            sys.exit(3)                     # the sender went away: leave nothing behind
        i, left = struct.unpack(">IQ", head)
        if i == 0xFFFFFFFF:
            break
        rel, _, mtime_ns, mode = files[i]
        path = os.path.join(root, rel)
        fd = -1
        try:
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            tmp = "%s.fluidctl-%d.tmp" % (path, os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            errors.append("%s: %s" % (rel, exc.strerror))
            tmp = None
        while left:
            n = inp.readinto(view[:min(left, len(buf))])
            if not n:
                sys.exit(3)
            left -= n
            if fd >= 0:
                try:
                    chunk = view[:n]
                    while chunk:
                        chunk = chunk[os.write(fd, chunk):]
                except OSError as exc:
                    errors.append("%s: %s" % (rel, exc.strerror))
                    os.close(fd)
                    fd = -1
                    os.unlink(tmp)
                    tmp = None
        if fd >= 0:
            try:
                os.fchmod(fd, mode)
                os.close(fd)
                fd = -1
                os.utime(tmp, ns=(mtime_ns, mtime_ns))
                os.replace(tmp, path)
            except OSError as exc:
                errors.append("%s: %s" % (rel, exc.strerror))
                if fd >= 0:
                    os.close(fd)
                os.unlink(tmp)
            tmp = None
finally:
    if tmp:
        try:
            os.unlink(tmp)
        except OSError:
            pass
reply({"errors": errors})
'''

# what the node's shell runs: read the receiver's length, then its code, from stdin
LOADER = "import sys;i=sys.stdin.buffer;exec(i.read(int(i.readline())))"
# -I -S: no site-packages, no user environment: the receiver needs the standard library only,
# and starts faster without them
REMOTE_COMMAND = f"exec python3 -I -S -c {shlex.quote(LOADER)}"
# AES-GCM first: with AES-NI it is the fastest of OpenSSH's defaults
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")


class PushUnavailable(Exception):
    """This transport cannot reach the node (no ssh client, no python3 there): use SFTP."""


class PushFailed(Exception):
    """The node was reached but the push failed; the message says why."""


@dataclass
class LocalFile:
    rel: str
    path: str
    size: int
    mtime_ns: int
    mode: int


@dataclass
class PushResult:
    remote_dir: str
    sent: List[str] = field(default_factory=list)     # relative paths
    sent_bytes: int = 0
    unchanged: int = 0


def ssh_command(host: str, *, user: Optional[str] = None, port: Optional[int] = None,
                ssh_config: Optional[str] = None, accept_new: bool = False,
                timeout: float = 10.0, ssh: str = "ssh") -> List[str]:
    """The OpenSSH argv that reaches ``host`` as the user's own ``ssh host`` would (same config
    file, so Host aliases, keys, ProxyJump and known_hosts behave alike), never prompting."""
    argv = [ssh, "-T", "-x", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(timeout))}",
            "-o", "ServerAliveInterval=5", "-o", "LogLevel=ERROR", "-c", CIPHERS]
    if ssh_config:
        argv += ["-F", str(ssh_config)]
    if accept_new:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    return argv + ["--", host]


def have_ssh_client(ssh: str = "ssh") -> bool:
    return shutil.which(ssh) is not None


def scan(files: Sequence[tuple]) -> List[LocalFile]:
    """(relative path, path, stat) as ``fluidctl.backends.sync.walk`` lists them -> what the
    receiver is told about each file."""
    return [LocalFile(rel, str(path), st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
            for rel, path, st in files]


class _Channel:
    """The ssh process: stdin written raw, stdout read by line, stderr kept for messages."""

    def __init__(self, argv: List[str]):
        try:
            self.proc = subprocess.Popen(argv + [REMOTE_COMMAND], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         bufsize=0)
        except FileNotFoundError:
            raise PushUnavailable(f"{argv[0]} not found") from None
        self.fd = self.proc.stdin.fileno()
        self.stderr = b""
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        self.stderr = self.proc.stderr.read()

    def write(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def sendfile(self, path: str, size: int) -> int:
        """Up to ``size`` bytes of a file into the pipe; returns how many were sent."""
        with open(path, "rb") as f:
            sent = 0
            while sent < size:
                n = os.sendfile(self.fd, f.fileno(), sent, size - sent)
                if n == 0:
                    break
                sent += n
        return sent

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise self.failure()
        return json.loads(line)

    def failure(self) -> Exception:
        self.close()
        self._drain.join(5)
        code = self.proc.returncode
        text = self.stderr.decode(errors="replace").strip().splitlines()
        reason = text[-1] if text else f"exit code {code}"
        if code == 127:
            return PushUnavailable(f"no python3 on the node ({reason})")
        return PushFailed(reason)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()


def connect(ssh_argv: List[str]) -> "_Channel":
    """Start ssh and send it the receiver's code at once, so that the handshake and the node's
    python3 start while the caller is still listing its files; then ``push(..., channel=)``."""
    channel = _Channel(ssh_argv)
    code = RECEIVER.encode()
    try:
        channel.write(b"%d\n" % len(code) + code)      # fits the pipe: never blocks
    except (BrokenPipeError, ConnectionResetError):
        pass                                           # told by push, from ssh's stderr
    return channel


def push(ssh_argv: List[str], files: Sequence[LocalFile], remote_dir: str,
         compare: str = "mtime", on_bytes: Optional[Callable[[int], None]] = None,
         channel: Optional["_Channel"] = None) -> PushResult:
    """Make ``remote_dir`` on the node hold ``files`` (missing or changed ones are sent; by size
    and mtime, or by size and sha256 with ``compare="hash"``). Raises PushUnavailable when this
    transport cannot work there (fall back to SFTP), PushFailed with the reason otherwise.
    ``channel``: one started by ``connect(ssh_argv)`` earlier."""
    channel = channel or connect(ssh_argv)
    try:
        request = {"dir": remote_dir, "compare": compare,
                   "files": [[f.rel, f.size, f.mtime_ns, f.mode] for f in files]}
        channel.write(json.dumps(request).encode() + b"\n")
        answer = channel.reply()
        need = set(answer["need"])
        for index, remote_digest in answer.get("digests", {}).items():
            from fluidctl.digest import file_digest
            if file_digest(files[int(index)].path, "sha256") != remote_digest:
                need.add(int(index))
        result = PushResult(remote_dir, unchanged=len(files) - len(need))
        _stream(channel, files, sorted(need), result, on_bytes)
        channel.write(HEADER.pack(END, 0))
        channel.proc.stdin.close()
        errors = channel.reply()["errors"]
    except (BrokenPipeError, ConnectionResetError):
        raise channel.failure() from None
    except BaseException:
        channel.kill()
        raise
    channel.close()
    if errors:
        raise PushFailed(f"{len(errors)} file(s) not written: {'; '.join(errors[:5])}")
    if channel.proc.returncode:
        raise channel.failure()
    return result


def _stream(channel: _Channel, files: Sequence[LocalFile], need: List[int], result: PushResult,
            on_bytes: Optional[Callable[[int], None]]) -> None:
    batch = bytearray()
    for index in need:
        item = files[index]
        if item.size >= SENDFILE_FROM:
            if batch:
                channel.write(batch)
                batch.clear()
            channel.write(HEADER.pack(index, item.size))
            sent = channel.sendfile(item.path, item.size)
            if sent != item.size:       # it shrank since it was listed: the stream must go on
                raise PushFailed(f"{item.path} changed while being sent; run the sync again")
        else:
            with open(item.path, "rb") as f:
                data = f.read(item.size + 1)
            if len(data) != item.size:
                raise PushFailed(f"{item.path} changed while being sent; run the sync again")
            batch += HEADER.pack(index, item.size)
            batch += data
            if len(batch) >= BATCH:
                channel.write(batch)
                batch.clear()
        result.sent.append(item.rel)
        result.sent_bytes += item.size
        if on_bytes:
            on_bytes(item.size)
    if batch:
        channel.write(batch)
