"""``--nodes`` over a hostfile (local, ssh, fabric, mpi), the pure half: ``N`` (use the first N
nodes of --hostfile that are not in the bad-node ledger; the rest are spares) or, over ssh and
fabric, ``MIN:MAX`` (an elastic job), read once into a ``HostNodes``; and which nodes an
elastic job's next world runs on when some were lost (survivors first, in their order, then
spares in hostfile order, never more than MAX; fewer than MIN is the caller's error to
report). The launcher that does it is ``backends/ssh/elastic.py`` (``ElasticMembers``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, NamedTuple, Optional, Sequence, Union

from fluidctl.errors import UsageError

NODES_HINT = "give a count, e.g. --nodes 4, or a range, e.g. --nodes 2:4"


class NodeRange(NamedTuple):
    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}:{self.high}"


def parse_nodes(text) -> Union[int, NodeRange]:
    """--nodes as given: a count (a fixed-size job) or ``MIN:MAX`` as a NodeRange."""
    text = str(text).strip()
    if ":" not in text:
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"--nodes {text} is not a count of nodes", NODES_HINT)
        return int(text)
    low, _, high = text.partition(":")
    try:
        value = NodeRange(int(low), int(high))
    except ValueError:
        raise UsageError(f"--nodes {text} is not MIN:MAX", NODES_HINT) from None
    if value.low < 1 or value.high < value.low:
        raise UsageError(f"--nodes {text}: MIN must be at least 1 and MAX at least MIN",
                         NODES_HINT)
    return value


@dataclass(frozen=True)
class HostNodes:
    """What ``--nodes`` means over a hostfile: ``count`` nodes at least (None: every node
    named), or an ``elastic`` range (ssh, fabric). A backend's own options may extend it."""
    count: Optional[int] = None
    elastic: Optional[NodeRange] = None

    @classmethod
    def of(cls, config) -> "HostNodes":
        """A hostfile backend's parsed options (``config.backend_options``), or none given."""
        options = config.backend_options
        return options if isinstance(options, HostNodes) else cls()


def host_nodes(text, hosts: int, mode: str = "collective", elastic: bool = False) -> HostNodes:
    """--nodes as given (None: absent) for a backend whose nodes are the ``hosts`` lines of
    --hostfile/--hosts; ``elastic``: it runs elastic jobs (ssh, fabric)."""
    if text is None:
        return HostNodes()
    nodes = parse_nodes(text)
    if isinstance(nodes, NodeRange):
        if not elastic:
            raise UsageError(f"--nodes {nodes} (an elastic job) needs --backend ssh or fabric",
                             "add --backend ssh, or give a fixed --nodes N")
        check_hosts(nodes, hosts, mode)
        return HostNodes(elastic=nodes)
    if not hosts and nodes > 1:
        raise UsageError(f"--nodes {nodes}, but without --hostfile or --hosts the job runs on "
                         "this machine alone", "name the nodes with --hostfile or --hosts (or "
                         "run inside a Slurm allocation with --backend slurm)")
    if nodes > max(1, hosts):
        raise UsageError(f"--nodes {nodes}, but --hostfile/--hosts name {hosts} node(s)",
                         f"name at least {nodes} nodes, or lower --nodes")
    return HostNodes(count=nodes)


def node_count(text, backend: str, what: str = "a count") -> Optional[int]:
    """--nodes as a plain count (None: absent), for a backend that places nodes itself
    (Slurm's node count, Kubernetes' pod count): a range is one line."""
    if text is None:
        return None
    nodes = parse_nodes(text)
    if isinstance(nodes, NodeRange):
        raise UsageError(f"--nodes {nodes} (an elastic job) is for --backend ssh or fabric",
                         f"give --backend {backend} {what}, e.g. --nodes 2")
    return nodes


def check_hosts(nodes: NodeRange, hosts: int, mode: str = "collective") -> None:
    """An elastic job runs collective ranks on a hostfile that holds at least MIN nodes."""
    if mode != "collective":
        raise UsageError(f"--nodes {nodes} (an elastic job) needs --mode collective",
                         "drop --mode pserver, or give a fixed --nodes N")
    if hosts < nodes.low:
        raise UsageError(f"--nodes {nodes}, but --hostfile/--hosts name {hosts} node(s)",
                         f"name at least {nodes.low} nodes, or lower MIN")


def next_world(current: Sequence[str], pool: Sequence[str], lost: Iterable[str],
               excluded: Iterable[str], nodes: NodeRange) -> List[str]:
    """The nodes of the next world: ``current`` minus ``lost``, then the ``pool``'s other nodes
    (spares) that are neither lost nor ``excluded`` (the ledger), in pool order, up to MAX."""
    gone, barred = set(lost), set(excluded)
    world = [h for h in current if h not in gone][:nodes.high]
    for host in pool:
        if len(world) >= nodes.high:
            break
        if host not in gone and host not in barred and host not in world:
            world.append(host)
    return world
