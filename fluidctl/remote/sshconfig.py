"""How to reach a host over SSH, as the user's OpenSSH would: ``~/.ssh/config`` (or the file
given with ``--ssh-config``) resolves an alias to HostName, Port, User, IdentityFile,
UserKnownHostsFile, StrictHostKeyChecking, ProxyJump / ProxyCommand and ConnectTimeout.

Host keys follow OpenSSH too: a key not in known_hosts is refused unless the user opted in
(``StrictHostKeyChecking accept-new`` / ``no`` in the config, or ``accept_new=True`` from
``--accept-new-host-keys``); a key that changed is always refused. Accepted keys are appended to
the first UserKnownHostsFile, as ssh does.
"""
from __future__ import annotations

import dataclasses
import getpass
import os
import shlex
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fluidctl.remote.sshlib import enable_match_exec, paramiko

from fluidctl.errors import UsageError
from fluidctl.planning.hosts import Host

DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")

_known_hosts_lock = threading.Lock()     # parallel connects may append to the same file


class HostKeyError(paramiko.SSHException):
    """The server's key is unknown and the policy says refuse: the message says how to fix."""


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to open one SSH connection, already resolved."""
    alias: str                        # the name in the hostfile
    hostname: str                     # where to connect (HostName)
    port: int = 22
    user: str = ""
    identity_files: Tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: Tuple[str, ...] = ()
    strict_host_key_checking: str = "ask"   # yes | ask | accept-new | no
    proxy_jump: Tuple["SSHTarget", ...] = ()  # hops, first hop first
    proxy_command: Optional[str] = None
    connect_timeout: Optional[float] = None

    @property
    def accepts_new_keys(self) -> bool:
        return self.strict_host_key_checking in ("accept-new", "no", "off")

    @property
    def key_name(self) -> str:
        """How known_hosts names this server: ``host`` on port 22, else ``[host]:port``."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def load_config(path=None) -> paramiko.SSHConfig:
    """The named file (which must exist), else ~/.ssh/config if there is one, else empty."""
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise UsageError(f"ssh config {path} not found", "pass --ssh-config with an existing file")
    else:
        path = Path(DEFAULT_CONFIG).expanduser()
        if not path.is_file():
            return paramiko.SSHConfig()
    try:
        enable_match_exec(path.read_text(errors="replace"))
        return paramiko.SSHConfig.from_path(str(path))
    except Exception as exc:  # paramiko raises ConfigParseError, ValueError, ...
        raise UsageError(f"cannot read ssh config {path}: {exc}",
                         "fix the file or pass --ssh-config with another") from None


def _files(value, defaults: Sequence[str]) -> Tuple[str, ...]:
    if value is None:
        items = list(defaults)
    elif isinstance(value, list):
        items = [part for v in value for part in shlex.split(v)]
    else:
        items = shlex.split(value)
    return tuple(os.path.expanduser(item) for item in items if item.lower() != "none")


def _split_jump(spec: str) -> Host:
    """One ProxyJump hop: ``[user@]host[:port]`` (ssh:// URLs too)."""
    spec = spec.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user, _, rest = spec.rpartition("@")
    port = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = int(tail[1:])
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = int(port_text)
    else:
        host = rest
    return Host(name=host, port=port, user=user or None)


def resolve(host: Host, config: Optional[paramiko.SSHConfig] = None, accept_new: bool = False,
            _depth: int = 0) -> SSHTarget:
    """Resolve one hostfile entry. The hostfile's own ``user@`` and ``:port`` win over the
    config, as on the ssh command line."""
    config = config if config is not None else paramiko.SSHConfig()
    options = config.lookup(host.name)
    hostname = options.get("hostname", host.name)
    try:
        port = host.port or int(options.get("port", 22))
    except ValueError:
        raise UsageError(f"ssh config: bad Port {options.get('port')!r} for {host.name}",
                         "set Port to a number") from None
    user = host.user or options.get("user") or getpass.getuser()
    strict = "accept-new" if accept_new else options.get(
        "stricthostkeychecking", "ask").lower()
    jumps: Tuple[SSHTarget, ...] = ()
    jump_spec = options.get("proxyjump")
    if jump_spec and jump_spec.lower() != "none":
        if _depth > 8:
            raise UsageError(f"ssh config: ProxyJump loop for {host.name}",
                             "check the ProxyJump lines of your ssh config")
        hops = [resolve(_split_jump(part), config, accept_new, _depth + 1)
                for part in jump_spec.split(",")]
        # a hop that itself jumps goes through its own hops first
        jumps = tuple(t for hop in hops for t in (*hop.proxy_jump, hop))
        jumps = tuple(dataclasses.replace(hop, proxy_jump=()) for hop in jumps)
    proxy_command = options.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    timeout = options.get("connecttimeout")
    return SSHTarget(
        alias=host.name, hostname=hostname, port=port, user=user,
        identity_files=_files(options.get("identityfile"), ()),
        identities_only=options.get("identitiesonly", "no").lower() == "yes",
        known_hosts_files=_files(options.get("userknownhostsfile"), DEFAULT_KNOWN_HOSTS),
        strict_host_key_checking=strict, proxy_jump=jumps,
        proxy_command=proxy_command if not jumps else None,
        connect_timeout=float(timeout) if timeout else None)


def resolve_hosts(hosts: Sequence[Host], ssh_config=None, accept_new: bool = False
                  ) -> Tuple[List[Host], Dict[str, SSHTarget]]:
    """Every host with its ``address`` set to the resolved HostName, and how to reach it. Two
    entries reaching the same server are the user's mistake (the slots would be counted twice)."""
    config = load_config(ssh_config) if not isinstance(ssh_config, paramiko.SSHConfig) else ssh_config
    resolved, targets, seen = [], {}, {}
    for host in hosts:
        target = resolve(host, config, accept_new)
        key = (target.hostname.lower(), target.port)
        if key in seen:
            raise UsageError(f"hosts {seen[key]} and {host.name} both reach "
                             f"{target.hostname}:{target.port}", "list each node once")
        seen[key] = host.name
        targets[host.name] = target
        resolved.append(host.with_address(target.hostname, target.port, target.user))
    return resolved, targets


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a key that is not known at all (a changed key raises
    BadHostKeyException before this)."""

    def __init__(self, target: SSHTarget):
        self.target = target

    def missing_host_key(self, client, hostname, key):
        if not self.target.accepts_new_keys:
            raise HostKeyError(
                f"host key of {self.target.alias} ({self.target.key_name}, "
                f"{key.get_name()}) is not in known_hosts; refusing to connect")
        client.get_host_keys().add(hostname, key.get_name(), key)
        files = self.target.known_hosts_files
        if files:
            path = Path(files[0])
            with _known_hosts_lock:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with open(path, "a", encoding="ascii") as out:
                    out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def load_known_hosts(client: paramiko.SSHClient, target: SSHTarget) -> None:
    """System and user known_hosts into the client, without making paramiko rewrite them."""
    keys = client.get_host_keys()
    for path in (*SYSTEM_KNOWN_HOSTS, *target.known_hosts_files):
        if os.path.isfile(path):
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException):
                continue  # an unreadable or malformed file: as ssh, ignore it


def nodelay_transport(sock, **kwargs) -> paramiko.Transport:
    """paramiko's Transport over ``sock`` with Nagle's algorithm off (TCP_NODELAY), as
    OpenSSH's client sets it, and what arrives acknowledged at once (``QuickAckSocket``).
    paramiko leaves Nagle on: each small request (a key exchange step, a channel open, a node
    plan) then waits for the peer's delayed ACK, 40 ms apiece on Linux, which made 40 of a
    60 ms connect. A jump host's channel or a ProxyCommand is no TCP socket: left as it is."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = QuickAckSocket.taking(sock)
    return paramiko.Transport(sock, **kwargs)


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges each read at once (TCP_QUICKACK before every read: Linux
    clears the flag by itself). sshd keeps Nagle's algorithm on for a session without a
    terminal. Once the user is authenticated it sends a message that gets no answer (its host
    keys); its next one, the session channel's confirmation, then waits for our delayed ACK of
    that one: 40 of the 43 ms of every session's opening, on the path to every node's agent
    (OpenSSH's own client waits the same). One system call per read."""

    @classmethod
    def taking(cls, sock: socket.socket) -> socket.socket:
        """``sock``'s connection as a QuickAckSocket (``sock`` is left detached); ``sock``
        itself where the system has no TCP_QUICKACK."""
        if not hasattr(socket, "TCP_QUICKACK"):
            return sock
        timeout = sock.gettimeout()
        quick = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        quick.settimeout(timeout)
        return quick

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv(bufsize, flags)

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv_into(buffer, nbytes, flags)


def connect_kwargs(target: SSHTarget, timeout: float) -> dict:
    """Keyword arguments for ``SSHClient.connect`` (shared by the ssh and fabric backends)."""
    identities = [f for f in target.identity_files if os.path.isfile(f)]
    if not target.identity_files and not target.identities_only:
        identities = [os.path.expanduser(f) for f in DEFAULT_IDENTITIES
                      if os.path.isfile(os.path.expanduser(f))]
    timeout = min(timeout, target.connect_timeout) if target.connect_timeout else timeout
    return dict(username=target.user, key_filename=identities or None,
                look_for_keys=not target.identities_only and not identities,
                allow_agent=not target.identities_only,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                transport_factory=nodelay_transport)
