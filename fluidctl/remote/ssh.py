"""Nodes over SSH with paramiko: connect with a timeout (through ProxyJump hops if configured),
run commands streaming their output line by line, notice a lost connection, and connect to many
nodes in parallel. Workspace sync lives in ``fluidctl.remote.sftp``, the ``cluster check``
probes in ``fluidctl.cluster.check``; both drive the SSHNode defined here.

Host settings and host-key policy come from ``fluidctl.remote.sshconfig``; this module only
moves bytes. Every failure a user can cause ends as a short ``reason`` naming what to change.
"""
from __future__ import annotations

import logging
import posixpath
import shlex
import signal as signal_module
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from fluidctl.remote.sshlib import paramiko

from fluidctl.lines import LineSplitter
from fluidctl.planning.hosts import Host
from fluidctl.remote.sshconfig import (HostKeyError, HostKeyPolicy, SSHTarget, connect_kwargs,
                                       load_known_hosts)

# paramiko logs every failed handshake with a traceback; the reasons below say it in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

DEFAULT_TIMEOUT = 10.0
PID_MARK = "FLUIDCTL_PID="
# on_line(stream, line): stream is "stdout" or "stderr"
LineCallback = Callable[[str, str], None]
Command = Union[str, Sequence[str]]


class ConnectFailed(Exception):
    """Could not reach or log into a node; ``str()`` is the reason, naming what to change."""


class SFTPUnavailable(paramiko.SSHException):
    """The node's sshd serves no SFTP subsystem (``cluster setup`` moves its files over SFTP)."""

    def __init__(self, host: str):
        super().__init__(f"{host} has no SFTP server, which cluster setup needs (add "
                         "'Subsystem sftp internal-sftp' to its sshd_config)")


class ConnectionLost(Exception):
    """The SSH connection to a node died while a command ran."""


# "the node is gone": what talking to a node raises once its connection died (TimeoutError is
# an OSError); caught as one tuple wherever a dead node ends the conversation
NODE_LOST = (ConnectionLost, EOFError, OSError, paramiko.SSHException)


def _closed_by_peer(exc: BaseException) -> bool:
    """paramiko's "Error reading SSH protocol banner" raised while handling an EOF or a reset:
    the server accepted and hung up at once (what OpenSSH calls "Connection closed by remote
    host"), not a server that stayed silent until the deadline."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (EOFError, ConnectionResetError, BrokenPipeError)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def describe_connect_error(exc: BaseException, target: SSHTarget, timeout: float,
                           timeout_option: str = "--timeout") -> str:
    """One sentence per failure a user meets, saying what to check; ``timeout_option`` is the
    flag of the calling command that sets ``timeout`` ("" when it has none)."""
    where = f"{target.hostname}:{target.port}"
    slow = f"; raise {timeout_option} for slow networks" if timeout_option else ""
    if isinstance(exc, HostKeyError):
        return f"{exc} (check the key, then add it to known_hosts, or pass --accept-new-host-keys)"
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"host key of {target.alias} ({target.key_name}) does not match known_hosts: "
                f"refusing to connect (if the node was reinstalled, remove the old key with "
                f"ssh-keygen -R '{target.key_name}')")
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(target.identity_files) or "default keys and agent"
        return (f"authentication as {target.user} failed at {where} with {keys} "
                "(check User and IdentityFile in the ssh config, or install the key with ssh-copy-id)")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or \
            isinstance(exc, ConnectionRefusedError):
        return f"connection refused at {where} (is sshd running there? check Port in the ssh config)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {target.hostname} (check the hostfile or HostName in the ssh config)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return (f"no answer from {where} within {timeout:g}s (is the node up and the address "
                f"right?{slow})")
    text = str(exc) or type(exc).__name__
    if _closed_by_peer(exc):
        return (f"connection closed by remote host {where} before the SSH handshake (is that "
                "port sshd's? sshd's MaxStartups, hosts.allow/deny or a firewall close it too)")
    if any(word in text.lower() for word in ("banner", "no existing session", "negotiation")):
        return (f"no SSH handshake with {where} within {timeout:g}s (is sshd listening on that "
                f"port?{slow})")
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect to {where}: {exc.strerror}"
    return f"ssh to {where} failed: {text}"


def shell_command(command: Command, env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[str] = None, report_pid: bool = False) -> str:
    """The one string sent to the remote shell. The environment is exported inline (sshd only
    accepts the variables its AcceptEnv lists); an argv list is exec'd so its pid is the
    session's; ``report_pid`` prints that pid first so the process group can be signalled."""
    parts = []
    if report_pid:
        parts.append(f"printf '{PID_MARK}%s\\n' $$")
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)} || exit 97")
    if env:
        parts.append("export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()))
    if isinstance(command, str):
        parts.append(command)
    else:
        parts.append("exec " + " ".join(shlex.quote(str(a)) for a in command))
    return "; ".join(parts)


@dataclass
class CommandResult:
    host: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""


def _handle_channel_request(channel: paramiko.Channel, m: paramiko.Message) -> None:
    """paramiko ignores the ``exit-signal`` request sshd sends when a command dies of a signal;
    note it on the channel so such a command reports -signum (as subprocess does)."""
    start = m.packet.tell()
    try:
        if m.get_text() == "exit-signal":
            m.get_boolean()
            channel.exit_signal = m.get_text()
    except Exception:
        pass
    m.packet.seek(start)
    paramiko.Channel._handle_request(channel, m)
    if channel.status_event.is_set():     # the command ended: the pump's end checks run now
        from fluidctl.remote.pump import poke
        poke()


def record_exit_signals(transport: paramiko.Transport) -> None:
    table = dict(paramiko.Transport._channel_handler_table)
    table[paramiko.common.MSG_CHANNEL_REQUEST] = _handle_channel_request
    transport._channel_handler_table = table


class RemoteProcess:
    """A command running on a node: its output is read by the channel pump (one thread for
    every channel, ``remote/pump.py``) and handed, line by line, to ``on_line``. ``wait`` returns its exit code (-N if signal N ended it) or raises
    ConnectionLost. The Fabric backend reuses everything but the readers."""

    def __init__(self, node: "SSHNode", channel: paramiko.Channel,
                 on_line: Optional[LineCallback], capture: bool, report_pid: bool):
        from fluidctl.remote.pump import pump
        self._setup(node, on_line, capture, report_pid)
        self.channel = channel
        splitters = {stream: LineSplitter(lambda line, stream=stream: self._line(stream, line))
                     for stream in ("stdout", "stderr")}

        def end():
            for splitter in splitters.values():
                splitter.close()
            self._pid_known.set()
        # read by the process's one channel pump, not by threads of its own
        self._drained = pump().read(channel, splitters["stdout"].feed,
                                    splitters["stderr"].feed, end)

    def _setup(self, node, on_line, capture, report_pid) -> None:
        self.node = node
        self.channel: Optional[paramiko.Channel] = None
        self.pid: Optional[int] = None
        self._pid_known = threading.Event()
        self._expect_pid = report_pid
        if not report_pid:
            self._pid_known.set()
        self._on_line = on_line
        self._captured: Dict[str, List[str]] = {"stdout": [], "stderr": []} if capture else {}
        self._closed_by_us = False

    def _line(self, stream: str, line: str) -> None:
        if self._expect_pid and stream == "stdout" and not self._pid_known.is_set():
            if line.startswith(PID_MARK):
                self.pid = int(line[len(PID_MARK):])
                self._pid_known.set()
                return
        if self._captured:
            self._captured[stream].append(line)
        if self._on_line:
            self._on_line(stream, line)

    def wait_pid(self, timeout: Optional[float] = None) -> Optional[int]:
        self._pid_known.wait(timeout)
        return self.pid

    def poll(self) -> Optional[int]:
        """The exit code once done, else None, without blocking; raises ConnectionLost if the
        connection died or the node stopped answering keepalives."""
        if not self.channel.exit_status_ready():
            transport = self.channel.get_transport()
            if self.channel.closed or transport is None or not transport.is_active() or \
                    not self.node.responsive():
                return self.wait(timeout=1.0)
            return None
        return self.wait(timeout=1.0)

    def _wait_status(self, deadline: Optional[float]) -> None:
        """Until the channel reports an exit or closes; keepalive pings catch a silent peer."""
        while not self.channel.status_event.wait(0.2):
            transport = self.channel.get_transport()
            if transport is None or not transport.is_active() or not self.node.responsive():
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"command on {self.node.host.name} still running")

    def _exit_code(self) -> int:
        if self.channel.exit_status_ready() and self.channel.exit_status != -1:
            return self.channel.exit_status
        name = getattr(self.channel, "exit_signal", None)
        if name:
            try:
                return -int(signal_module.Signals["SIG" + name])
            except KeyError:
                return 255
        if self._closed_by_us:
            return -int(signal_module.SIGHUP)
        raise ConnectionLost(f"connection to {self.node.host.name} "
                             f"({self.node.target.hostname}:{self.node.target.port}) was lost")

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the command ends (its output fully read). ``timeout`` raises
        TimeoutError; a dead connection raises ConnectionLost."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_status(deadline)
        self._drained.wait(None if deadline is None else max(0.1, deadline - time.monotonic()))
        return self._exit_code()

    @property
    def stdout(self) -> str:
        return "\n".join(self._captured.get("stdout", []))

    @property
    def stderr(self) -> str:
        return "\n".join(self._captured.get("stderr", []))

    def send_signal(self, sig: int = signal_module.SIGTERM) -> bool:
        """Signal the remote process group (needs ``report_pid``), over a new channel."""
        pid = self.wait_pid(timeout=5)
        if pid is None or self.channel.exit_status_ready():
            return False
        name = signal_module.Signals(sig).name[3:]
        try:
            return self.node.run(f"kill -{name} -- -{pid} 2>/dev/null || kill -{name} {pid}",
                                 timeout=self.node.timeout).exit_code == 0
        except (ConnectFailed, *NODE_LOST):
            return False

    def close(self) -> None:
        """Close the channel (the remote side sees EOF; use send_signal to stop it first)."""
        self._closed_by_us = True
        self.channel.close()


class SSHNode:
    """One connected node. ``host.address`` is updated to the address actually reached."""

    def __init__(self, host: Host, target: SSHTarget, timeout: float = DEFAULT_TIMEOUT,
                 keepalive: float = 5.0, timeout_option: str = "--timeout"):
        self.host = host
        self.target = target
        self.timeout = timeout
        self.timeout_option = timeout_option    # the flag that sets timeout, for messages
        self.keepalive = keepalive
        self.client: Optional[paramiko.SSHClient] = None
        self._hops: List[paramiko.SSHClient] = []
        self._sftp: Optional[paramiko.SFTPClient] = None
        self._ping_lock = threading.Lock()
        self._pending_ping = None          # ([monotonic time it went out], answered event)
        self._last_ping = self._last_look = time.monotonic()

    # --- connection -----------------------------------------------------------------------
    def _client_for(self, target: SSHTarget, sock) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        load_known_hosts(client, target)
        client.set_missing_host_key_policy(HostKeyPolicy(target))
        try:
            client.connect(target.hostname, port=target.port, sock=sock,
                           **connect_kwargs(target, self.timeout))
        except BaseException:
            client.close()
            raise
        return client

    def connect(self) -> "SSHNode":
        """Open the connection, raising ConnectFailed with a reason that says what to fix."""
        self._reaching = self.target
        try:
            self._open()
        except Exception as exc:
            self.close()
            where = self._reaching
            reason = describe_connect_error(exc, where, self.timeout, self.timeout_option)
            if where is not self.target:
                reason = f"via jump host {where.alias}: {reason}"
            raise ConnectFailed(reason) from None
        transport = self.client.get_transport()
        record_exit_signals(transport)
        if self.keepalive:
            transport.set_keepalive(max(1, int(self.keepalive)))
        return self

    def _open(self) -> None:
        """Through each ProxyJump hop in turn (a direct-tcpip channel is the next socket)."""
        sock = None
        for hop in self.target.proxy_jump:
            self._reaching = hop
            client = self._client_for(hop, sock)
            self._hops.append(client)
            sock = client.get_transport().open_channel(
                "direct-tcpip", (self.target.hostname, self.target.port), ("127.0.0.1", 0),
                timeout=self.timeout)
        self._reaching = self.target
        if sock is None and self.target.proxy_command:
            sock = paramiko.ProxyCommand(self.target.proxy_command)
        self.client = self._client_for(self.target, sock)

    @property
    def peer_address(self) -> str:
        """The address the connection reached (for endpoints); the HostName through a jump."""
        if self.target.proxy_jump or self.target.proxy_command:
            return self.target.hostname
        try:
            return self.client.get_transport().getpeername()[0]
        except (AttributeError, OSError):
            return self.target.hostname

    def _ping(self) -> threading.Event:
        """Send a keepalive request from a thread; the event is set when the server answers."""
        transport = self.client.get_transport() if self.client else None
        answered = threading.Event()
        sent = [None]                       # when it really went out (a starved thread: later)

        def ping():
            sent[0] = time.monotonic()
            try:
                transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:
                return
            answered.set()
        if transport is not None and transport.is_active():
            threading.Thread(target=ping, daemon=True, name=f"ssh-ping-{self.host.name}").start()
        else:
            sent[0] = time.monotonic()      # nothing to send on: overdue from now
        return sent, answered

    def responsive(self) -> bool:
        """Non-blocking liveness for polling loops: a keepalive goes out every ``keepalive``
        seconds; one unanswered for longer than that means the peer is gone, and the transport
        is closed so every reader on it ends. Always True with keepalive=0."""
        if not self.keepalive or self.client is None:
            return True
        now = time.monotonic()
        with self._ping_lock:
            looked, self._last_look = self._last_look, now
            pending = self._pending_ping
            if pending is not None:
                (sent,), answered = pending
                if answered.is_set():
                    self._pending_ping = None
                elif now - looked > self.keepalive:
                    # nobody looked for longer than a keepalive: this process was stopped or
                    # starved (a loaded machine), and the answer may be waiting behind it; the
                    # node is not blamed for that, it is asked again
                    self._pending_ping = None
                    self._last_ping = now - self.keepalive
                elif sent is not None and now - sent > self.keepalive:
                    transport = self.client.get_transport()
                    if transport is not None:
                        transport.close()
                    return False
            if self._pending_ping is None and now - self._last_ping >= self.keepalive:
                self._last_ping = now
                self._pending_ping = self._ping()
        return True

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        for client in [self.client, *reversed(self._hops)]:
            if client is not None:
                client.close()
        self.client = None
        self._hops = []

    def __enter__(self):
        return self.connect() if self.client is None else self

    def __exit__(self, *exc):
        self.close()

    # --- commands -------------------------------------------------------------------------
    def start(self, command: Command, on_line: Optional[LineCallback] = None,
              env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
              capture: bool = False, report_pid: bool = True) -> RemoteProcess:
        transport = self.client.get_transport() if self.client else None
        if transport is None or not transport.is_active():
            raise ConnectionLost(f"not connected to {self.host.name}")
        channel = transport.open_session(timeout=self.timeout)
        channel.exec_command(shell_command(command, env, cwd, report_pid))
        channel.shutdown_write()
        return RemoteProcess(self, channel, on_line, capture, report_pid)

    def run(self, command: Command, on_line: Optional[LineCallback] = None,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            timeout: Optional[float] = None) -> CommandResult:
        """Run to the end; output goes to ``on_line`` as it comes and is returned too."""
        proc = self.start(command, on_line, env, cwd, capture=True, report_pid=False)
        try:
            code = proc.wait(timeout)
        except TimeoutError:
            proc.close()
            raise
        return CommandResult(self.host.name, code, proc.stdout, proc.stderr)

    # --- files ----------------------------------------------------------------------------
    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except paramiko.SSHException as exc:
                if not self.client.get_transport() or \
                        not self.client.get_transport().is_active():
                    raise
                raise SFTPUnavailable(self.host.name) from exc
            self._sftp.get_channel().settimeout(max(self.timeout, 30.0))
        return self._sftp

    def remote_tree(self, remote_dir: str) -> Dict[str, paramiko.SFTPAttributes]:
        """relative path -> attributes of every file under ``remote_dir`` (empty if absent)."""
        found: Dict[str, paramiko.SFTPAttributes] = {}
        pending = [""]
        while pending:
            rel = pending.pop()
            try:
                entries = self.sftp.listdir_attr(posixpath.join(remote_dir, rel) if rel else remote_dir)
            except FileNotFoundError:
                continue
            for entry in entries:
                path = posixpath.join(rel, entry.filename) if rel else entry.filename
                if stat.S_ISDIR(entry.st_mode or 0):
                    pending.append(path)
                    found[path + "/"] = entry
                else:
                    found[path] = entry
        return found

    def makedirs(self, remote_dir: str, known: Optional[set] = None) -> None:
        known = known if known is not None else set()
        parts = []
        path = remote_dir.rstrip("/") or "/"
        while path not in ("", "/") and path not in known:
            parts.append(path)
            path = posixpath.dirname(path)
        for path in reversed(parts):
            try:
                self.sftp.mkdir(path)
            except OSError:
                try:
                    if not stat.S_ISDIR(self.sftp.stat(path).st_mode):
                        raise
                except FileNotFoundError:
                    raise
            known.add(path)

    def remote_sha256(self, paths: Sequence[str]) -> Dict[str, str]:
        if not paths:
            return {}
        result = self.run(["sha256sum", "--", *paths])
        digests = {}
        for line in result.stdout.splitlines():
            digest, _, name = line.partition("  ")
            digests[name] = digest
        return digests


# --- many nodes -----------------------------------------------------------------------------
@dataclass
class Connected:
    """Result of connecting to every node: the ones that answered and why the others did not."""
    nodes: Dict[str, SSHNode]
    failures: Dict[str, str]

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


PARALLEL = 32       # nodes worked on at once (connected to, started on)


def parallel(items: Sequence, fn: Callable, workers: int = PARALLEL) -> List:
    """``fn`` over ``items`` in at most ``workers`` threads, results in input order; the
    first exception (in input order) is raised once every item is done.

    A Ctrl-C returns at once (KeyboardInterrupt): the threads are daemons that nothing
    waits for. A thread pool's exit would join them, and a node that accepts a connection
    but never answers holds its thread for the whole --ssh-timeout; what they started ends
    with this process's connections."""
    items = list(items)
    if not items:
        return []
    results: List = [None] * len(items)
    errors: Dict[int, BaseException] = {}
    queue, lock = iter(range(len(items))), threading.Lock()

    def work() -> None:
        while True:
            with lock:
                index = next(queue, None)
            if index is None:
                return
            try:
                results[index] = fn(items[index])
            except BaseException as exc:      # noqa: BLE001 - raised in the caller's thread
                errors[index] = exc
    threads = [threading.Thread(target=work, name=f"fluidctl-nodes-{n}", daemon=True)
               for n in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:          # a join is interrupted by Ctrl-C, as any lock wait
        thread.join()
    if errors:
        raise errors[min(errors)]
    return results


def connect_all(hosts: Sequence[Host], targets: Mapping[str, SSHTarget],
                timeout: float = DEFAULT_TIMEOUT, node_class=None,
                timeout_option: str = "--timeout", progress=None) -> Connected:
    """Connect to every node at once; the slowest bounds the wait (``timeout`` each).

    ``progress(host, text)`` hears each node connect or fail (a ``remote.progress.NodeProgress``
    also names a silent node while it is waited for)."""
    node_class = node_class or SSHNode
    started = time.monotonic()

    def one(host):
        node = node_class(host, targets[host.name], timeout=timeout,
                          timeout_option=timeout_option)
        try:
            found = host.name, node.connect(), None
        except ConnectFailed as exc:
            found = host.name, None, str(exc)
        if progress:
            progress(host.name, f"connected ({time.monotonic() - started:.1f} s)"
                     if found[2] is None else
                     f"cannot connect ({time.monotonic() - started:.1f} s)")   # why: at the end
        return found
    connected = parallel(list(hosts), one)
    nodes, failures = {}, {}
    for name, node, reason in connected:
        if node is None:
            failures[name] = reason
        else:
            nodes[name] = node
    return Connected(nodes, failures)
