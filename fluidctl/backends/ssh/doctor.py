"""The rendezvous doctor: multi-node problems found before any rank starts.

Rendezvous trouble (a busy port, a master nobody can reach, MASTER_ADDR not on rank 0's node,
NCCL picking the wrong network interface) otherwise shows up minutes later as a time-out. Once
the job is planned, and before the plan is handed out, the launcher asks the node agents:

1. node 0's agent binds every port its processes will use and *listens* on the master port
   (MASTER_ADDR:MASTER_PORT): a busy port, or a MASTER_ADDR that is not an address of node 0,
   is reported there;
2. every other node's agent, asked at the same time, binds its own ports and connects to the
   master port, as its ranks will, trying a refusal again for a moment while node 0 starts
   listening (a firewall or a wrong address is reported by the node that cannot get through);
3. node 0 stops listening when its plan arrives and rank 0 binds it. Node 0 accepts every
   test connection and lets the peer close first, so a job of any size gets through (a socket
   that only listens lets its backlog through and drops the rest) and the master port is left
   in no TIME_WAIT.

Every problem is one line naming the node and the fix. The agents' probes also list their
network interfaces; the interface holding each node's address, when the same name on every
node (e.g. ``eth0``; several names are given as a list), is exported as NCCL_SOCKET_IFNAME and
GLOO_SOCKET_IFNAME unless the user set them.

The node's half (``node_checks``) is ``fluidctl.node.doctor``; this is the launcher's.
"""
from __future__ import annotations

import ipaddress
from typing import Dict, List, Optional, Sequence

from fluidctl.agentproto import DOCTOR_CONNECT_TIMEOUT as CONNECT_TIMEOUT
from fluidctl.agentproto import DOCTOR_UNREACHED as UNREACHED

# seconds a node tries a refused master port again (node 0 is asked at the same time)
REFUSED_WAIT = 2.0

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def node_interface(address: str, ifaces: Dict[str, List[Sequence[str]]]) -> Optional[str]:
    """The interface whose network holds ``address`` (127.0.0.2 is on lo's 127.0.0.0/8)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    exact = [name for name, addrs in ifaces.items() if any(a == address for a, _ in addrs)]
    if exact:
        return exact[0]
    for name, addrs in ifaces.items():
        for a, mask in addrs:
            try:
                if ip in ipaddress.ip_network(f"{a}/{mask}", strict=False):
                    return name
            except ValueError:
                continue
    return None


def socket_ifnames(addresses: Sequence[str], ifaces: Sequence[dict]) -> Optional[str]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for nodes at ``addresses``: the interface each
    node is reached on, one name when they agree, a comma-separated list when they differ;
    None when any node's interface is unknown (nothing is exported then). ``ifaces``: each
    node's interfaces, as its agent's probe lists them."""
    names = []
    for address, node_ifaces in zip(addresses, ifaces):
        name = node_interface(address, node_ifaces or {})
        if name is None:
            return None
        if name not in names:
            names.append(name)
    return ",".join(names) if names else None


def node_ifnames(addresses: Sequence[str], ifaces: Sequence[dict]) -> List[Optional[str]]:
    """Each node's own interface (the one it is reached on), None where unknown: exported per
    node, since torch's gloo takes GLOO_SOCKET_IFNAME's names as exact interfaces of the node
    (a list naming another node's interface fails there)."""
    return [node_interface(address, found or {}) for address, found in zip(addresses, ifaces)]


def ifname_env(name: str) -> dict:
    """The variables for a node reached on ``name``: NCCL takes NCCL_SOCKET_IFNAME as prefixes
    (``eth0`` would also match ``eth01`` or ``eth0.100``) unless written ``=eth0``."""
    return {"NCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name}


def requests(plan) -> List[dict]:
    """What each node's agent checks: its ports; node 0 listens on the master port, every
    other node connects to it."""
    from fluidctl import envs
    master_addr, master_port = envs.split_endpoint(plan.master)
    out = []
    peers = len(plan.job.nodes) - 1
    for i, node in enumerate(plan.job.nodes):
        ports = [[int(envs.split_endpoint(p.endpoint)[1]), f"{p.label}'s endpoint"]
                 for p in plan.on_node(i)]
        out.append({"address": node.address, "ports": ports,
                    "listen": [master_addr, int(master_port)] if i == 0 else None,
                    "peers": peers if i == 0 else 0,
                    "connect": None if i == 0 else [master_addr, int(master_port)]})
    return out


def examine(plan, hosts, agents, timeout: float) -> List[str]:
    """Run the checks through the agents, all at once (one round trip for the job): the other
    nodes try a refused master port again for REFUSED_WAIT seconds, while node 0 starts
    listening. One line per problem, naming the node; when node 0 has problems, the others'
    failures to reach its master port follow from them and are left out."""
    reqs = requests(plan)
    for req in reqs[1:]:
        req["refused_wait"] = REFUSED_WAIT

    wait = timeout + CONNECT_TIMEOUT + REFUSED_WAIT

    def ask(i: int) -> List[str]:
        reply = agents[i].doctor(reqs[i], wait)
        if reply is None:
            return [f"node {hosts[i].name}: no answer to the rendezvous check within "
                    f"{wait:g}s (raise --ssh-timeout)"]
        return [f"node {hosts[i].name}: {p}" for p in reply]

    from fluidctl.remote.ssh import parallel
    found = parallel(list(range(len(agents))), ask)
    problems = list(found[0])
    for i, lines in enumerate(found[1:], start=1):
        if found[0]:
            lines = [line for line in lines
                     if not line.startswith(f"node {hosts[i].name}: {UNREACHED}")]
        problems += lines
    return problems
