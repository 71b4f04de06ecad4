"""The deep check's arithmetic (cluster/health.py) and the ledger's part in choosing a job's
nodes (cluster/gate.py), in-process; the measurements themselves run on namespace nodes in
tests/cluster/test_health_gate.py."""
import pytest

from fluidctl.cluster import gate, health, ledger
from fluidctl.errors import UsageError
from fluidctl.planning.hosts import Host


def test_ring_rounds_are_disjoint_and_cover_every_edge_of_the_ring():
    assert health.ring_rounds(1) == []
    assert health.ring_rounds(2) == [[(0, 1)]]
    assert health.ring_rounds(8) == [[(0, 1), (2, 3), (4, 5), (6, 7)],
                                     [(1, 2), (3, 4), (5, 6), (7, 0)]]
    rounds = health.ring_rounds(5)
    assert sorted(e for r in rounds for e in r) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]
    for r in rounds:
        ends = [n for e in r for n in e]
        assert len(ends) == len(set(ends))              # no node in two pairs at once


def test_an_outlier_is_named_with_its_figure_and_its_peers_median():
    nodes = [health.NodeHealth(f"node{k}", figures={"gemm_gflops": v, "net_gbps": 5.0})
             for k, v in enumerate([40.0, 41.0, 4.1, 40.9, 39.0, 42.0], 1)]
    nodes[4].figures["net_gbps"] = 0.0096
    health.compare(nodes)
    assert nodes[2].outliers == ["node3: CPU GEMM 4.10 GFLOP/s, 0.10x the peers' median 40.9"]
    assert nodes[4].outliers == ["node5: network 0.0096 Gbit/s, 0.002x the peers' median 5.00"]
    assert [n.host for n in nodes if not n.ok] == ["node3", "node5"]
    assert nodes[0].medians["gemm_gflops"] == 40.9      # the median of the others, not its own
    record = health.HealthReport(nodes, 1.0).to_record()
    assert record["threshold"] == 0.5 and record["nodes"][2]["outliers"] == nodes[2].outliers


def test_ledgered_nodes_are_left_out_unless_included_and_too_few_is_one_line(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    hosts = [Host(f"node{k}") for k in range(1, 5)]
    ledger.record("node2", ledger.LOST, "no heartbeat for 3.0 s")
    ledger.record("node9", ledger.HEALTH, "not in this hostfile")
    said = []
    chosen = gate.choose(hosts, min_nodes=2, say=said.append)
    assert [h.name for h in chosen] == ["node1", "node3", "node4"]
    assert said == ["note: leaving out 1 node(s) in the bad-node ledger: node2 (lost, no "
                    "heartbeat for 3.0 s) (--include-bad uses them; fluidctl cluster ledger "
                    "clear HOST forgets them)"]
    assert [h.name for h in gate.choose(hosts, min_nodes=2, want=2, say=said.append)] == [
        "node1", "node3"]                               # --nodes 2: the first two usable
    assert len(gate.choose(hosts, min_nodes=4, include_bad=True, say=None)) == 4
    with pytest.raises(UsageError) as caught:
        gate.choose(hosts, min_nodes=4, say=said.append)
    assert caught.value.one_line() == (
        "error: 1 of 4 node(s) are in the bad-node ledger (node2): 3 left, 4 required (pass "
        "--include-bad to use them, or forget them with fluidctl cluster ledger clear HOST)")
    ledger.record("node2", ledger.LOST, "gone", exclude_s=-1)   # expired: used again
    assert len(gate.choose(hosts, min_nodes=4, say=said.append)) == 4


class _Busy:
    """Scripted CPU/memory figures: node3 was measured in a busy moment and the machine stays
    busy while it is measured again, so every node measured then (node3 and any peer beside
    it) gives half its calm figure."""

    def __init__(self, nodes):
        self.nodes = {n.host: n for n in nodes}
        self.calls = []

    def __call__(self, host, keep):
        self.calls.append((host, keep))
        fresh = {"mem_gbps": 20.0 * 0.49}           # the busy moment, for whoever runs now
        if keep:
            node = self.nodes[host]
            node.figures["mem_gbps"] = max(node.figures["mem_gbps"], fresh["mem_gbps"])
        return fresh


def test_a_disk_at_half_its_peers_speed_is_no_outlier_at_a_quarter_it_is():
    """fsync'd writes wait on a journal the machine's other writers share: healthy nodes
    measured 0.49x their peers' median beside a busy neighbour (and were left out of a job);
    disk write speed is named under a quarter of the median, every other figure under half."""
    nodes = [health.NodeHealth(f"node{k}", figures={"write_mbps": 1000.0, "mem_gbps": 20.0})
             for k in range(1, 6)]
    nodes[1].figures["write_mbps"] = 480.0
    nodes[2].figures["write_mbps"] = 240.0
    nodes[3].figures["mem_gbps"] = 9.6
    health.compare(nodes)
    assert [n.host for n in nodes if not n.ok] == ["node3", "node4"]
    assert nodes[2].outliers == ["node3: disk write 240 MB/s, 0.24x the peers' median 1000"]
    peer = {"write_mbps": 1000.0}
    assert health.suspects(nodes, ("write_mbps",)) == [nodes[2]]
    health.confirm_suspects(nodes, lambda host, keep: {"write_mbps": 300.0} if host == "node3"
                            else peer, ("write_mbps",))
    health.compare(nodes)
    assert "write_mbps" in nodes[2].cleared and nodes[2].ok     # 0.3x a peer beside it


def test_40_13_a_node_as_fast_as_a_peer_measured_beside_it_is_no_outlier():
    """Four identical nodes; node3's memory bandwidth measured 0.49x the median in a busy
    moment that lasts through its re-measurements. Measured beside a peer, it is as fast as
    the peer: a busy machine, not a bad node (it used to be named, and ledgered under
    --health-gate)."""
    nodes = [health.NodeHealth(f"node{k}", figures={"mem_gbps": 20.0}) for k in range(1, 5)]
    nodes[2].figures["mem_gbps"] = 9.8
    remeasure = _Busy(nodes)
    health.confirm_suspects(nodes, remeasure, ("mem_gbps",), health.THRESHOLD)
    health.compare(nodes)
    assert all(n.ok for n in nodes), [n.outliers for n in nodes]
    assert remeasure.calls[0] == ("node3", True)                    # kept: node3's best
    assert remeasure.calls[1][0] != "node3" and remeasure.calls[1][1] is False  # the peer's not


def test_40_13_a_node_slower_than_a_peer_beside_it_stays_an_outlier():
    nodes = [health.NodeHealth(f"node{k}", figures={"mem_gbps": 20.0}) for k in range(1, 5)]
    nodes[2].figures["mem_gbps"] = 2.0

    def remeasure(host, keep):              # node3 really is slow; the peers are not
        return {"mem_gbps": 2.0 if host == "node3" else 20.0}
    health.confirm_suspects(nodes, remeasure, ("mem_gbps",), health.THRESHOLD)
    health.compare(nodes)
    assert [n.host for n in nodes if not n.ok] == ["node3"]
