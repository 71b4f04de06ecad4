"""The node half of the rendezvous doctor (``fluidctl.backends.ssh.doctor``): the checks a node agent
runs on its node before any rank starts. Standard library, psutil and fluidctl.net only."""
from __future__ import annotations

import errno
import socket
from typing import Dict, List, Optional, Tuple

from fluidctl.agentproto import DOCTOR_CONNECT_TIMEOUT as CONNECT_TIMEOUT


def interfaces() -> Dict[str, List[Tuple[str, str]]]:
    """This node's IPv4 interfaces that are up: {name: [(address, netmask)]}."""
    import psutil
    stats = psutil.net_if_stats()
    found: Dict[str, List[Tuple[str, str]]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        v4 = [(a.address, a.netmask or "255.255.255.255") for a in addrs
              if a.family == socket.AF_INET]
        if v4:
            found[name] = v4
    return found


def node_checks(request: dict) -> Tuple[List[str], Optional[socket.socket]]:
    """Problems on this node, and the master socket left listening (node 0) until the plan
    arrives. ``request``: {"address", "ports": [[port, what]], "listen": [addr, port] or
    None, "connect": [addr, port] or None}."""
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
            held = bind_socket(addr, int(port))
            held.listen(64)
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
            socket.create_connection((addr, int(port)), timeout=CONNECT_TIMEOUT).close()
        except OSError as exc:
            why = exc.strerror or "timed out"
            problems.append(f"cannot reach the master {addr}:{port} ({why}: open the port "
                            f"between the nodes, or list node 0 under an address this node "
                            f"can reach)")
    return problems, held


def _bind_problem(exc: OSError, addr: str, port: int, what: str) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {addr}:{port} ({what}) is in use (stop what holds it, or let fluidctl "
                f"pick free ports: drop --started-port)")
    return f"cannot bind {addr}:{port} ({what}): {exc.strerror}"
