"""Pushing a local tree to a node through one OpenSSH process: ``cluster sync``'s transport.

``push(ssh_argv, source, remote_dir)`` starts ``ssh ... python3 -c <loader>`` and talks to a
small standard-library receiver (``RECEIVER``, sent over stdin: nothing is installed on the node,
which needs only ``python3``; neither fluidctl nor rsync). One round trip decides what to send,
then every file streams through the one connection:

1. fluidctl sends the receiver's code, then the file list: its length, then NUL-separated
   fields (the remote directory, how to compare, and every local file's relative path, size,
   mtime_ns and mode; paths as the bytes the file system holds).
2. The receiver stats those paths only (never walks the remote tree) and answers one line: the
   indices it needs (missing, another size, another mtime in whole seconds, as the SFTP path
   compares), or with ``compare="hash"`` ``index:sha256`` for every same-size file, which
   fluidctl compares with its own.
3. fluidctl streams each needed file as a 12-byte header (index, size) and its bytes (small
   files batched into large writes, large ones with ``sendfile``), then an end marker. The
   receiver writes each to a temporary name beside its target, sets mode and mtime (ns), and
   renames it into place: a reader never sees a half-written file, an interrupted push leaves
   no temporary file behind.
4. The receiver answers ``E <path>: <reason>`` per file it could not write (permission
   denied, disk full), if any, then ``done``.

The receiver imports only os and sys (hashlib with ``compare="hash"``): json (which
imports re) would double its start-up. It runs under the node's ``/usr/bin/python3`` where
there is one (see ``REMOTE_COMMAND``).

Why OpenSSH and not paramiko's SFTP: ssh's C ciphers, no request/response round trip per file,
and no paramiko import (a quarter of a second) on the way. The ssh argv comes from
``fluidctl.remote.sshargv`` (the user's ssh config, the fastest cipher it allows);
:class:`PushUnavailable` tells the caller to fall back to SFTP (no ``ssh`` client here, no
``python3`` on the node).
"""
from __future__ import annotations

import _thread       # not threading: it imports functools and collections, start-up time
import os
import struct

from fluidctl.sigs import SIGKILL, SIGPIPE, SIGXFSZ

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Callable, List, Optional, Sequence

END = 0xFFFFFFFF
HEADER = struct.Struct(">IQ")            # file index, size
BATCH = 1 << 20                          # small files are gathered into writes this large
SENDFILE_FROM = 256 << 10                # files this large go through sendfile

RECEIVER = r'''
import os, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
req = inp.read(int(inp.readline())).split(b"\0")
root, compare, fields = req[0], req[1], req[2:]     # 4 per file: path, size, mtime_ns, mode
count = len(fields) // 4
try:
    top = os.open(root, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
except OSError:
    top = -1
if top < 0:                         # not there yet: every file is needed
    answer = [b"%d" % i for i in range(count)]
else:
    answer = []
    stat = os.stat
    for i in range(count):
        k = 4 * i
        if int(fields[k + 3]) & 0o170000 == 0o120000:     # a symlink: its target, field 2
            try:
                same = os.readlink(fields[k], dir_fd=top) == fields[k + 1]
            except OSError:
                same = False
            if not same:
                answer.append(b"%d" % i)
            continue
        try:                                    # relative to the directory: no path joins
            st = stat(fields[k], dir_fd=top, follow_symlinks=False)
        except OSError:
            answer.append(b"%d" % i)
            continue
        if st.st_size != int(fields[k + 1]) or st.st_mode & 0o170000 != 0o100000:
            answer.append(b"%d" % i)
        elif compare == b"hash":
            import hashlib
            h = hashlib.sha256()
            with open(os.path.join(root, fields[k]), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            answer.append(b"%d:%s" % (i, h.hexdigest().encode()))
        elif st.st_mtime_ns // 10**9 != int(fields[k + 2]) // 10**9:   # whole seconds, as SFTP
            answer.append(b"%d" % i)
out.write(b" ".join(answer) + b"\n")
out.flush()
errors, made, tmp = [], set(), None
def failed(rel, exc):
    name = rel.decode("utf-8", "replace").replace("\n", "\\n")
    errors.append(b"%s: %s" % (name.encode(), str(exc.strerror).encode()))
buf = bytearray(1 << 20)
view = memoryview(buf)
try:
    while True:
        head = inp.read(12)
        if len(head) < 12:
            sys.exit(3)                     # the sender went away: leave nothing behind
        i, left = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")   # HEADER
        if i == 0xFFFFFFFF:
            break
        rel, mtime_ns, mode = fields[4 * i], int(fields[4 * i + 2]), int(fields[4 * i + 3])
        path = os.path.join(root, rel)
        fd = -1
        try:
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            tmp = b"%s.fluidctl-%d.tmp" % (path, os.getpid())
            if mode & 0o170000 == 0o120000:     # a symlink, made as one: nothing follows
                os.symlink(fields[4 * i + 1], tmp)
                try:
                    os.replace(tmp, path)
                except OSError:             # a directory there, say: named in the answer
                    os.unlink(tmp)
                    raise
                tmp = None
                continue
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            failed(rel, exc)
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
                    failed(rel, exc)
                    os.close(fd)
                    fd = -1
                    os.unlink(tmp)
                    tmp = None
        if fd >= 0:
            try:
                os.fchmod(fd, mode & 0o7777)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
                os.close(fd)
                fd = -1
                os.replace(tmp, path)
            except OSError as exc:
                failed(rel, exc)
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
out.write(b"".join(b"E " + e + b"\n" for e in errors) + b"done\n")
out.flush()
os._exit(0)     # every file is closed: skip the interpreter's teardown, ssh exits sooner
'''

# What the node's shell runs (sh, bash, zsh, fish or csh: one exec and quoted words): read the
# receiver's length, then its code, from stdin. The receiver needs only the standard library,
# so the system's /usr/bin/python3 is taken where there is one: a version manager's python3
# shim first on PATH (pyenv, asdf) costs a second interpreter per start. Else python3 from PATH.
# -I -S: no site-packages, no user environment: faster, and nothing of the node's to import.
LOADER = "import sys;i=sys.stdin.buffer;exec(i.read(int(i.readline())))"
_PICK = '[ -x /usr/bin/python3 ] && exec /usr/bin/python3 "$@"; exec python3 "$@"'
REMOTE_COMMAND = f"exec sh -c '{_PICK}' python3 -I -S -c '{LOADER}'"    # neither holds a '


class PushUnavailable(Exception):
    """This transport cannot reach the node (no ssh client, no python3 there): use SFTP."""


class PushFailed(Exception):
    """The node was reached but the push failed; the message says why."""


class LocalFile:
    """One file to send: its path relative to the source, its path here, and its stat."""
    __slots__ = ("rel", "path", "size", "mtime_ns", "mode")

    def __init__(self, rel: str, path: str, size: int, mtime_ns: int, mode: int):
        self.rel, self.path, self.size, self.mtime_ns, self.mode = rel, path, size, mtime_ns, mode

    def __repr__(self) -> str:
        return f"LocalFile({self.rel!r}, {self.size} bytes)"


class FileList:
    """The files of a push, listed once for every node, by index (the protocol's file number):
    ``fluidctl.remote.sftp.walk``'s (relative path, path, stat) entries, a :class:`LocalFile`
    made only for a file that is sent, and the request's file fields encoded once, however
    many nodes are sent the same list."""

    def __init__(self, entries: Sequence[tuple]):
        self.entries = entries
        self._fields: Optional[bytes] = None

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> LocalFile:
        rel, path, st = self.entries[index]
        if st.st_mode & 0o170000 == 0o120000:              # a symlink: no bytes to send
            return LocalFile(rel, str(path), 0, st.st_mtime_ns, st.st_mode)
        return LocalFile(rel, str(path), st.st_size, st.st_mtime_ns, st.st_mode & 0o7777)

    def total_bytes(self) -> int:
        return sum(st.st_size for _, _, st in self.entries if st.st_mode & 0o170000 != 0o120000)

    def fields(self) -> bytes:
        """Path, size, mtime_ns and mode of every file, NUL-separated (no path holds a NUL),
        paths as the bytes the file system holds: a name that is not UTF-8 arrives as it is."""
        if self._fields is None:
            text = "\0".join([f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode & 0o7777}"
                              if st.st_mode & 0o170000 != 0o120000 else
                              f"{rel}\0{_target(path)}\0{st.st_mtime_ns}\0{st.st_mode}"
                              for rel, path, st in self.entries])
            self._fields = os.fsencode(text)
        return self._fields


def _target(path) -> str:
    """A symlink's target (its field 2 in place of a size: the receiver makes the same link)."""
    try:
        return os.readlink(path)
    except OSError:         # gone since it was listed: a link to nowhere is still a link
        return "."


class PushResult:
    """What a push did: the files sent (relative paths), their bytes, how many were current.
    (Plain classes, not dataclasses: the decorator alone costs this start-up-sensitive path
    a couple of ms.)"""

    def __init__(self, remote_dir: str, unchanged: int = 0):
        self.remote_dir = remote_dir
        self.sent: List[str] = []
        self.sent_bytes = 0
        self.unchanged = unchanged
        self.vanished: List[str] = []       # files gone here before they could be sent


def scan(files: Sequence[tuple]) -> FileList:
    """(relative path, path, stat) as ``fluidctl.remote.sftp.walk`` lists them -> what the
    receiver is told about each file."""
    return FileList(files)


class _Channel:
    """The ssh process: stdin written raw, stdout read by line, stderr kept for messages.
    Started with ``os.posix_spawnp`` on pipes of its own (ssh closes every other descriptor
    itself): ``subprocess`` and what it imports would add to ``cluster sync``'s start-up,
    before the first handshake. A thread (``_thread``'s) reads stderr to its end, then reaps ssh."""

    def __init__(self, argv: List[str]):
        pipes = []
        try:
            for _ in range(3):
                pipes.append(os.pipe())         # not inheritable: exec closes our ends
            actions = [(os.POSIX_SPAWN_DUP2, pipes[0][0], 0), (os.POSIX_SPAWN_DUP2, pipes[1][1], 1),
                       (os.POSIX_SPAWN_DUP2, pipes[2][1], 2)]
            self.pid = os.posix_spawnp(argv[0], argv + [REMOTE_COMMAND], os.environ,
                                       file_actions=actions,
                                       setsigdef=(SIGPIPE, SIGXFSZ))
        except BaseException as exc:
            for pair in pipes:
                os.close(pair[0])
                os.close(pair[1])
            if isinstance(exc, FileNotFoundError):
                raise PushUnavailable(f"{argv[0]} not found") from None
            raise
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        self.fd = pipes[0][1]
        self.stdout = open(pipes[1][0], "rb")
        self._stderr_fd = pipes[2][0]
        self.stderr = b""
        self.returncode: Optional[int] = None
        self._reaped = _thread.allocate_lock()   # held until ssh is reaped: an event to wait on
        self._reaped.acquire()
        self._lock = _thread.allocate_lock()
        self._reading = False

    def start(self) -> None:
        """Send the receiver's code (it fits the pipe: never blocks) and start reading stderr."""
        code = RECEIVER.encode()
        try:
            self.write(b"%d\n" % len(code) + code)
        except (BrokenPipeError, ConnectionResetError):
            pass                                # told by push, from ssh's stderr
        self._start_reader()

    def _start_reader(self) -> None:
        """Start the thread that reads stderr to its end and then reaps ssh (once)."""
        if not self._reading:
            self._reading = True
            _thread.start_new_thread(self._read_stderr_then_reap, ())

    def _wait_reaped(self, timeout: float = -1) -> bool:
        if self._reaped.acquire(timeout=timeout):
            self._reaped.release()
            return True
        return False

    def _read_stderr_then_reap(self) -> None:
        try:
            with open(self._stderr_fd, "rb") as err:
                self.stderr = err.read()
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)     # ended, not yet reaped
        except ChildProcessError:           # close() reaped it already
            pass
        finally:
            self._reap_now()

    def _reap_now(self) -> None:
        """Reap ssh (waiting for it to end) unless that is done, and wake whoever waits.
        Under the lock _kill takes: a kill never reaches a pid already given back."""
        with self._lock:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
                self._reaped.release()

    def write(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close_stdin(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def sendfile(self, f, size: int) -> int:
        """Up to ``size`` bytes of an open file into the pipe; returns how many were sent."""
        sent = 0
        while sent < size:
            n = os.sendfile(self.fd, f.fileno(), sent, size - sent)
            if n == 0:
                break
            sent += n
        return sent

    def reply(self) -> bytes:
        line = self.stdout.readline()
        if not line.endswith(b"\n"):
            raise self.failure()
        return line[:-1]

    def failure(self) -> Exception:
        self.close()
        code = self.returncode
        text = self.stderr.decode(errors="replace").strip().splitlines()
        reason = text[-1] if text else f"exit code {code}"
        if code == 127:
            return PushUnavailable(f"no python3 on the node ({reason})")
        return PushFailed(reason)

    def close(self) -> None:
        """Close ssh's stdin and wait for it to exit (30 s at most, then kill it)."""
        self.close_stdin()
        self._start_reader()
        if not self._wait_reaped(30):
            self._kill()
            if not self._wait_reaped(5):    # a child of ssh's own (ProxyCommand) holds stderr
                self._reap_now()
        self.stdout.close()

    def _kill(self) -> None:
        with self._lock:
            if self.returncode is None:
                os.kill(self.pid, SIGKILL)   # not reaped yet: the pid is still ssh's

    def kill(self) -> None:
        self._kill()
        self.close()


def connect(ssh_argv: List[str]) -> "_Channel":
    """Start ssh and send it the receiver's code at once, so that the handshake and the node's
    python3 start while the caller is still listing its files; then ``push(..., channel=)``."""
    return connect_all([ssh_argv])[0]


def connect_all(ssh_argvs: Sequence[List[str]]) -> List["_Channel"]:
    """``connect`` for every node, every ssh started before any is given its code or its
    stderr reader: a thread's start waits for the new thread to run, which under load (the
    first ssh starting on the same CPUs) held the next node's ssh back."""
    channels: List[_Channel] = []
    try:
        for argv in ssh_argvs:
            channels.append(_Channel(argv))
    except BaseException:
        for channel in channels:
            channel.kill()
        raise
    for channel in channels:
        channel.start()
    return channels


def push(ssh_argv: List[str], files: FileList, remote_dir: str,
         compare: str = "mtime", on_bytes: Optional[Callable[[int], None]] = None,
         channel: Optional["_Channel"] = None,
         on_answer: Optional[Callable[[int, int], None]] = None) -> PushResult:
    """Make ``remote_dir`` on the node hold ``files`` (missing or changed ones are sent; by size
    and mtime, or by size and sha256 with ``compare="hash"``). Raises PushUnavailable when this
    transport cannot work there (fall back to SFTP), PushFailed with the reason otherwise.
    ``channel``: one started by ``connect(ssh_argv)`` earlier; ``on_answer(files, bytes)``
    hears, once the node has answered, what it will be sent."""
    channel = channel or connect(ssh_argv)
    try:
        channel.write(_request(files, remote_dir, compare))
        need = set()
        for token in channel.reply().split():
            index, _, remote_digest = token.partition(b":")
            if not remote_digest:
                need.add(int(index))
                continue
            from fluidctl.digest import file_digest     # --checksum only
            if file_digest(files[int(index)].path, "sha256") != remote_digest.decode():
                need.add(int(index))
        result = PushResult(remote_dir, unchanged=len(files) - len(need))
        if on_answer is not None:
            on_answer(len(need), sum(files[i].size for i in need))
        _stream(channel, files, sorted(need), result, on_bytes)
        channel.write(HEADER.pack(END, 0))
        channel.close_stdin()
        errors = []
        while True:
            line = channel.reply()
            if line == b"done":
                break
            errors.append(line[2:].decode(errors="replace"))
    except (BrokenPipeError, ConnectionResetError):
        raise channel.failure() from None
    except BaseException:
        channel.kill()
        raise
    channel.close()
    if errors:
        raise PushFailed(f"{len(errors)} file(s) not written: {'; '.join(errors[:5])}")
    if channel.returncode:
        raise channel.failure()
    return result


def _request(files: FileList, remote_dir: str, compare: str) -> bytes:
    """The file list, as the receiver reads it: its length on a line, then NUL-separated fields:
    the directory, the comparison, then path, size, mtime_ns and mode of every file."""
    body = os.fsencode(remote_dir) + b"\0" + compare.encode()
    if len(files):
        body += b"\0" + files.fields()
    return b"%d\n" % len(body) + body


def _stream(channel: _Channel, files: FileList, need: List[int], result: PushResult,
            on_bytes: Optional[Callable[[int], None]]) -> None:
    batch = bytearray()
    for index in need:
        item = files[index]
        if item.mode & 0o170000 == 0o120000:                 # a symlink: its header only
            batch += HEADER.pack(index, 0)
            result.sent.append(item.rel)
            continue
        try:
            f = open(item.path, "rb")
        except FileNotFoundError:       # deleted since it was listed: a warning, as rsync's
            result.vanished.append(item.rel)
            continue
        if item.size >= SENDFILE_FROM:
            if batch:
                channel.write(batch)
                batch.clear()
            channel.write(HEADER.pack(index, item.size))
            with f:
                sent = channel.sendfile(f, item.size)
            if sent != item.size:       # it shrank since it was listed: the stream must go on
                raise PushFailed(f"{item.path} changed while being sent; run the sync again")
        else:
            with f:
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
