"""Who is where, computed once at the root of the rendezvous and handed out by node.

Every member (a rank, or a node agent for its node's ranks) sends its records up once:
``{"rank", "ep", "node", "pid"}``. When all ``world`` records are in, ``lay_out`` groups
them by node in one O(N) pass: node order is the order of each node's lowest rank, a node's
leader is its lowest rank, and the leaders form the ring between nodes. ``NodeView`` is all a
node needs (its own ranks, world size, node count, its ring neighbours): a member never
receives the N endpoints of the whole world, so a reply is bounded by one node's size.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

MAX_RECORD = 512          # bytes of endpoint + node name per rank (hostnames are < 256)


class LayoutError(ValueError):
    """The records do not make one world (a rank twice, a rank outside the world)."""


class Layout:
    """The whole world's layout, kept by the root only; ``view`` answers one node."""

    def __init__(self, world: int, records: Dict[int, dict]):
        if len(records) != world or set(records) != set(range(world)):
            raise LayoutError(f"{len(records)} records for a world of {world}")
        self.world = world
        self.node_of: List[int] = [0] * world
        self.node_ranks: List[List[int]] = []
        self.records = records
        index: Dict[str, int] = {}
        for rank in range(world):               # rank order: node order = lowest rank first
            node = records[rank]["node"]
            i = index.get(node)
            if i is None:
                i = index[node] = len(self.node_ranks)
                self.node_ranks.append([])
            self.node_ranks[i].append(rank)
            self.node_of[rank] = i
        self.max_local = max(len(r) for r in self.node_ranks)
        self._views: Dict[int, dict] = {}

    def _leader(self, node: int) -> list:
        rank = self.node_ranks[node % len(self.node_ranks)][0]
        return [rank, self.records[rank]["ep"]]

    def view(self, rank: int) -> dict:
        """What ``rank``'s node needs: shared by every rank of the node (built once)."""
        node = self.node_of[rank]
        view = self._views.get(node)
        if view is None:
            view = self._views[node] = {
                "world": self.world, "nodes": len(self.node_ranks), "node_index": node,
                "max_local": self.max_local,
                "local": [[r, self.records[r]["ep"], self.records[r]["pid"]]
                          for r in self.node_ranks[node]],
                "prev": self._leader(node - 1), "next": self._leader(node + 1)}
        return view


def check_record(rec) -> Tuple[int, dict]:
    """(rank, record) from a member's message; ValueError when it is not one."""
    if not isinstance(rec, dict):
        raise ValueError("a rank record is a map")
    rank, ep, node, pid = rec.get("rank"), rec.get("ep"), rec.get("node"), rec.get("pid", 0)
    if not (isinstance(rank, int) and rank >= 0 and isinstance(ep, str) and isinstance(node, str)
            and isinstance(pid, int) and len(ep) + len(node) <= MAX_RECORD):
        raise ValueError(f"malformed rank record {str(rec)[:80]}")
    return rank, {"ep": ep, "node": node, "pid": pid}


class NodeView:
    """A rank's side of the layout (from ``Layout.view``)."""

    def __init__(self, view: dict):
        self.world, self.n_nodes = view["world"], view["nodes"]
        self.node_index, self.max_local = view["node_index"], view["max_local"]
        self.local = [r for r, _, _ in view["local"]]
        self.endpoints = {r: ep for r, ep, _ in view["local"]}
        self.pids = {r: pid for r, _, pid in view["local"]}
        self.prev: Tuple[int, str] = tuple(view["prev"])
        self.next: Tuple[int, str] = tuple(view["next"])

    @property
    def leader(self) -> int:
        return self.local[0]

    def ring_members(self) -> Tuple[Sequence[Optional[Tuple[int, str]]], int]:
        """(members, index) for ``Ring``: the ring of node leaders, of which this node only
        knows its own place and its two neighbours (all a ring link needs)."""
        members: List[Optional[Tuple[int, str]]] = [None] * self.n_nodes
        i = self.node_index
        members[(i - 1) % self.n_nodes] = self.prev
        members[(i + 1) % self.n_nodes] = self.next
        members[i] = (self.leader, self.endpoints[self.leader])
        return members, i
