"""The node half of the rendezvous doctor (``fluidctl.backends.ssh.doctor``): the checks a node
agent runs on its node before any rank starts. Standard library and fluidctl.net only."""
from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

from fluidctl.agentproto import DOCTOR_CONNECT_TIMEOUT as CONNECT_TIMEOUT
from fluidctl.agentproto import DOCTOR_UNREACHED as UNREACHED


def interfaces() -> Dict[str, List[Tuple[str, str]]]:
    """This node's IPv4 interfaces that are up: {name: [(address, netmask)]}."""
    from fluidctl.node.ifaddrs import ipv4_interfaces
    return ipv4_interfaces()


class MasterListener:
    """Node 0's master port during the rendezvous check: listening, and *accepting* every
    node's test connection until the plan arrives.

    A socket that listens but never accepts lets only its backlog through: the kernel drops
    the SYNs beyond it, so in a job of more nodes than the backlog the rest time out and
    report a master they cannot reach. Each accepted connection is held open until its peer
    closes it (the peer closes first, so TIME_WAIT lands on the peer's ephemeral port, not on
    the master port rank 0 binds next)."""

    def __init__(self, sock: socket.socket, backlog: int):
        self.sock = sock
        sock.listen(backlog)
        sock.setblocking(False)
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="doctor-master", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self._stop_r, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._stop_r:
                        return
                    if key.fileobj is self.sock:
                        self._accept(sel)
                    else:
                        self._drain(sel, key.fileobj)
        finally:
            for key in list(sel.get_map().values()):
                if key.fileobj not in (self.sock, self._stop_r):
                    key.fileobj.close()
            sel.close()

    def _accept(self, sel) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:                 # EMFILE and the like: the kernel keeps the rest queued
                return
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)

    @staticmethod
    def _drain(sel, conn) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            sel.unregister(conn)
            conn.close()

    def close(self) -> None:
        """Stop accepting and free the port (rank 0 binds it next)."""
        try:
            self._stop_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=CONNECT_TIMEOUT)
        for s in (self.sock, self._stop_r, self._stop_w):
            s.close()


def listen_backlog(peers: int) -> int:
    """A backlog that holds every connecting node at once (the kernel caps it at somaxconn)."""
    return max(64, min(int(peers) + 16, 65535))


def node_checks(request: dict) -> Tuple[List[str], Optional[MasterListener]]:
    """Problems on this node, and the master port left listening and accepting (node 0) until
    the plan arrives. ``request``: {"address", "ports": [[port, what]], "listen": [addr, port]
    or None, "connect": [addr, port] or None, "peers": nodes that will connect}."""
    from fluidctl.net import bind_socket
    problems: List[str] = []
    address = request["address"]
    for port, what in request.get("ports", []):
        try:
            bind_socket(address, int(port)).close()
        except OSError as exc:
            problems.append(_bind_problem(exc, address, int(port), what))
    held = None
    if request.get("listen"):
        addr, port = request["listen"]
        try:
            held = MasterListener(bind_socket(addr, int(port)),
                                  listen_backlog(request.get("peers", 64)))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                problems.append(f"MASTER_ADDR {addr} is not an address of this node, but rank 0 "
                                f"runs here (list this node under the address its peers reach "
                                f"it by)")
            else:
                problems.append(_bind_problem(exc, addr, int(port), "the master port"))
    if request.get("connect"):
        addr, port = request["connect"]
        try:
            reach_master(addr, int(port), float(request.get("refused_wait", 0.0)))
        except OSError as exc:
            why = exc.strerror or "timed out"
            problems.append(f"{UNREACHED} {addr}:{port} ({why}: open the port "
                            f"between the nodes, or list node 0 under an address this node "
                            f"can reach)")
    return problems, held



def reach_master(addr: str, port: int, refused_wait: float) -> None:
    """Connect to the master port and close. The launcher asks node 0 and the others at
    once, so node 0 may not listen yet: a refusal is tried again every few ms for
    ``refused_wait`` seconds (anything else, and a refusal after that, is the answer)."""
    deadline = time.monotonic() + refused_wait
    while True:
        try:
            socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT).close()
            return
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(REFUSED_AGAIN)


REFUSED_AGAIN = 0.001       # seconds between tries while node 0 may not listen yet (a refused
                            # connect costs tens of microseconds; each ms of wait is the job's)


def _bind_problem(exc: OSError, addr: str, port: int, what: str) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {addr}:{port} ({what}) is in use (stop what holds it, or let fluidctl "
                f"pick free ports: drop --started-port)")
    return f"cannot bind {addr}:{port} ({what}): {exc.strerror}"
