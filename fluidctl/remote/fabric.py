"""The same node interface as ``fluidctl.remote.ssh``, through Fabric: a ``fabric.Connection``
per node (ProxyJump hops become Fabric gateways), commands through Fabric's runners, and many
nodes at once through ``ssh.parallel`` like the paramiko nodes.

Fabric trusts unknown host keys by default (AutoAddPolicy); here every connection gets
fluidctl's policy instead, so unknown keys are refused unless the user opted in, exactly as in
the paramiko backend. Host settings are resolved by ``fluidctl.remote.sshconfig``, not by
Fabric's own ssh-config loading, so both backends reach the same address with the same key.
"""
from __future__ import annotations

import time
from typing import Mapping, Optional

import fabric

from fluidctl.remote import ssh
from fluidctl.lines import LineSplitter
from fluidctl.remote.ssh import Command, ConnectionLost, LineCallback, RemoteProcess, shell_command
from fluidctl.remote.sshconfig import HostKeyPolicy, SSHTarget, connect_kwargs, load_known_hosts


class _LineStream:
    """A file-like sink for invoke's runner: text in, whole lines out to a callback."""

    def __init__(self, on_line):
        self._splitter = LineSplitter(on_line)

    def write(self, text: str) -> None:
        self._splitter.feed(text.encode("utf-8", "surrogateescape"))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._splitter.close()


def _connection(target: SSHTarget, timeout: float, gateway=None) -> fabric.Connection:
    kwargs = connect_kwargs(target, timeout)
    kwargs.pop("username")
    if not kwargs.get("key_filename"):
        kwargs.pop("key_filename", None)     # Fabric iterates it
    config = fabric.Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    conn = fabric.Connection(target.hostname, user=target.user, port=target.port, config=config,
                             connect_kwargs=kwargs, gateway=gateway, inline_ssh_env=True)
    conn.client.set_missing_host_key_policy(HostKeyPolicy(target))
    load_known_hosts(conn.client, target)
    return conn


class FabricProcess(RemoteProcess):
    """A command started with ``Connection.run(asynchronous=True)``; Fabric's runner reads the
    channel and writes into line streams, the rest (pid, signals, exit code) is shared."""

    def __init__(self, node: "FabricNode", command: str, on_line: Optional[LineCallback],
                 capture: bool, report_pid: bool):
        self._setup(node, on_line, capture, report_pid)
        self._streams = {name: _LineStream(lambda line, name=name: self._line(name, line))
                         for name in ("stdout", "stderr")}
        self.promise = node.conn.run(command, asynchronous=True, hide=False, warn=True,
                                     pty=False, out_stream=self._streams["stdout"],
                                     err_stream=self._streams["stderr"])
        self.channel = self.promise.runner.channel

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_status(deadline)
        try:
            self.promise.join()
        finally:
            for stream in self._streams.values():
                stream.close()
            self._pid_known.set()
        return self._exit_code()

    def close(self) -> None:
        self._closed_by_us = True
        self.channel.close()


class FabricNode(ssh.SSHNode):
    """``ssh.SSHNode``'s interface (connect, run, start, sftp, close, peer_address) over a
    ``fabric.Connection``."""

    conn: Optional[fabric.Connection] = None

    def _open(self) -> None:
        gateway = None
        for hop in self.target.proxy_jump:
            self._reaching = hop
            gateway = _connection(hop, self.timeout, gateway)
            gateway.open()
        self._reaching = self.target
        if gateway is None and self.target.proxy_command:
            gateway = self.target.proxy_command
        self.conn = _connection(self.target, self.timeout, gateway)
        self.conn.open()
        self.client = self.conn.client

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        conn, self.conn = self.conn, None
        while isinstance(conn, fabric.Connection):
            gateway = conn.gateway
            conn.close()
            conn = gateway
        self.client = None

    def start(self, command: Command, on_line: Optional[LineCallback] = None,
              env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
              capture: bool = False, report_pid: bool = True) -> FabricProcess:
        if self.conn is None or not self.conn.is_connected:
            raise ConnectionLost(f"not connected to {self.host.name}")
        return FabricProcess(self, shell_command(command, env, cwd, report_pid), on_line,
                             capture, report_pid)

    @property
    def sftp(self):
        if self._sftp is None:
            self._sftp = self.conn.sftp()
        return self._sftp
