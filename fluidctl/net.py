"""Sockets and ports, shared by the launcher and the runtime (neither imports the other).

Ports for a job's endpoints are chosen without races.

Free ports are taken by binding and *holding* the bound sockets until the processes that
will use them have been started (``release()`` is called right after the spawn), so two
fluidctl jobs starting at once cannot be handed the same port. They are chosen below the
kernel's ephemeral range (net.ipv4.ip_local_port_range), where no outgoing connection of any
program takes its local port: between the release and the rank's own bind (seconds, while it
imports torch) a busy machine's outgoing connections would otherwise take ports of that range,
and the rank's bind fails with EADDRINUSE. ``--started-port P`` asks for
P, P+1, ...; a port there that something else holds is a usage error, found before anything runs.
"""
from __future__ import annotations

import errno
import socket
from typing import List, Optional

from fluidctl.errors import UsageError


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR), not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # SO_REUSEADDR: a port left in TIME_WAIT by a previous attempt of this job is still usable.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


UNCLAIMED_LOW = 10000      # ports chosen from here up to the ephemeral range, and below the
UNCLAIMED_HIGH = 20000     # ports Slurm steps derive from their job ids (envs.SLURM_PORT_LOW)
UNCLAIMED_TRIES = 64       # random picks there before the kernel's own choice (port 0)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_unclaimed(host: str) -> socket.socket:
    """A socket bound to a free port below the ephemeral range (a random one: two jobs
    starting at once rarely try the same), bound without SO_REUSEADDR so that a port another
    reservation holds, or one in TIME_WAIT, is refused and another tried (SO_REUSEADDR is set
    once bound: the rank that will use the port binds it before the release); the kernel's choice
    (port 0) where that range is full or empty."""
    import random
    high = min(_ephemeral_low(), UNCLAIMED_HIGH)
    if high - UNCLAIMED_LOW > UNCLAIMED_TRIES:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        for port in random.sample(range(UNCLAIMED_LOW, high), UNCLAIMED_TRIES):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
                # now the job's own process may bind it while the reservation holds it (as
                # with bind_socket); another reservation, binding without it, still may not
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise
    return bind_socket(host, 0)


MAX_PORTS = 60000          # a host has 64511 unprivileged ports; a job needing more is a typo


class PortReservation:
    """``count`` TCP ports on ``host``, held bound until ``release()``."""

    def __init__(self, host: str, count: int, started_port: Optional[int] = None):
        self.host = host
        self._socks: List[socket.socket] = []
        if count > MAX_PORTS:
            raise UsageError(f"the job needs {count} ports on {host}, more than one host has",
                             "lower --nproc")
        try:
            if started_port is None:
                for _ in range(count):
                    try:
                        self._socks.append(_bind_unclaimed(host))
                    except OSError as exc:
                        if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.EADDRINUSE):
                            raise
                        raise UsageError(
                            f"cannot reserve {count} ports on {host} ({len(self._socks)} "
                            f"reserved, then: {exc.strerror})",
                            "lower --nproc, or raise the open-files limit (ulimit -n)") from None
            else:
                for port in range(started_port, started_port + count):
                    self._socks.append(self._bind_fixed(host, port, started_port, count))
        except BaseException:
            self.release()
            raise
        self.ports: List[int] = [s.getsockname()[1] for s in self._socks]

    @staticmethod
    def _bind_fixed(host: str, port: int, first: int, count: int) -> socket.socket:
        if not 0 < port < 65536:
            raise UsageError(f"port {port} is out of range",
                             "choose --started-port so that all ports stay below 65536")
        try:
            return bind_socket(host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is busy (the job needs ports {first}-{first + count - 1})",
                    "choose another --started-port, or leave it out to use free ports") from None
            if exc.errno == errno.EACCES:
                raise UsageError(f"port {port} on {host} needs privileges",
                                 "use --started-port 1024 or higher") from None
            raise UsageError(f"cannot bind {host}:{port}: {exc.strerror}",
                             "check the address and --started-port") from None

    def release(self) -> None:
        for sock in self._socks:
            sock.close()
        self._socks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """``count`` distinct ports free right now, released at once: for tools that cannot hold
    a reservation until their user binds (remote probes, mpirun ranks, tests)."""
    with PortReservation(host, count) as res:
        return res.ports


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
