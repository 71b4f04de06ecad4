"""The ledger of bad nodes (fluidctl/cluster/ledger.py)."""
import json
import time

from fluidctl.cluster import ledger


def test_record_exclude_expire_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    ledger.record("node2", ledger.LOST, "no heartbeat for 3.0 s", job="j1")
    ledger.record("node3", ledger.HEALTH, "GEMM 4.1 GFLOP/s, peers' median 40.2", exclude_s=-1)
    assert set(ledger.excluded(["node1", "node2", "node3"])) == {"node2"}
    assert [e.host for e in ledger.entries(include_expired=True)] == ["node2", "node3"]
    assert (tmp_path / "bad-nodes.json").stat().st_mode & 0o777 == 0o600
    assert ledger.clear("node2") == ["node2"]
    assert ledger.excluded(["node2"]) == {}
    assert ledger.clear() == ["node3"]


def test_a_damaged_ledger_is_read_as_empty_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    (tmp_path / "bad-nodes.json").write_text("{not json")
    assert ledger.entries() == []
    entry = ledger.record("node1", ledger.CRASHED, "rank 3: SIGBUS")
    assert entry.active() and entry.until > time.time()
    assert "node1" in json.loads((tmp_path / "bad-nodes.json").read_text())["nodes"]
