"""The ledger of bad nodes (fluidctl/cluster/ledger.py)."""
import json
import os
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


# --- issue 40 items 6 and 12, issue 39 item 4 ---------------------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from fluidctl.planning.hosts import Host  # noqa: E402

WRONG_SHAPES = {
    "a list": "[1, 2]",
    "a string": '"nodes"',
    "nodes a list": '{"nodes": [1, 2]}',
    "until a word": '{"nodes": {"n1": {"host": "n1", "why": "lost", "detail": "", '
                    '"since": 1, "until": "tomorrow"}}}',
    "since null": '{"nodes": {"n1": {"host": "n1", "why": "lost", "detail": "", '
                  '"since": null, "until": 9e99}}}',
}


def fluidctl(tmp_path, *args):
    env = {**__import__("os").environ, "FLUIDCTL_STATE_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "fluidctl", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("shape", sorted(WRONG_SHAPES))
def test_40_6_a_ledger_of_the_wrong_shape_is_a_warning_and_read_as_empty(tmp_path, shape):
    ledger_file = tmp_path / "bad-nodes.json"
    ledger_file.write_text(WRONG_SHAPES[shape])
    res = fluidctl(tmp_path, "cluster", "ledger", "list")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"warning: the bad-node ledger {ledger_file}"), res.stderr
    assert "the bad-node ledger is empty" in res.stdout
    (tmp_path / "x.py").write_text("")
    res = fluidctl(tmp_path, "train", "--hosts", "127.0.0.2:1,127.0.0.3:1", "--dry-run", "x.py")
    assert "Traceback" not in res.stderr and "node 127.0.0.2: connection refused" in res.stderr
    assert ledger_file.read_text() == WRONG_SHAPES[shape]      # read, never rewritten


def test_40_12_clear_host_on_a_damaged_ledger_is_refused_and_keeps_the_file(tmp_path):
    ledger_file = tmp_path / "bad-nodes.json"
    ledger_file.write_text("{damaged")
    res = fluidctl(tmp_path, "cluster", "ledger", "clear", "node3")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"error: the bad-node ledger {ledger_file} is damaged" in res.stderr
    assert "node3 not cleared" in res.stderr
    assert ledger_file.read_text() == "{damaged"
    # clearing every node starts a new ledger and keeps the damaged one beside it
    res = fluidctl(tmp_path, "cluster", "ledger", "clear")
    assert res.returncode == 0, res.stderr
    [aside] = tmp_path.glob("bad-nodes.json.damaged-*")
    assert aside.read_text() == "{damaged" and f"moved to {aside}" in res.stderr
    assert json.loads(ledger_file.read_text()) == {"nodes": {}}


def test_40_6_recording_on_a_damaged_ledger_sets_it_aside_and_keeps_damaged_entries(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    ledger_file = tmp_path / "bad-nodes.json"
    ledger_file.write_text(WRONG_SHAPES["until a word"])
    ledger.record("n2", ledger.LOST, "no heartbeat for 3.0 s")
    nodes = json.loads(ledger_file.read_text())["nodes"]
    assert nodes["n1"]["until"] == "tomorrow" and nodes["n2"]["why"] == "lost"
    assert ledger.clear("n1") == ["n1"]
    assert set(json.loads(ledger_file.read_text())["nodes"]) == {"n2"}


def test_39_4_entries_are_keyed_by_the_nodes_address_not_its_alias(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    here = Host("node4", "127.0.0.4", 22)
    there = Host("node4", "198.18.0.4", 22)
    ledger.record(here, ledger.LOST, "no heartbeat for 3.0 s")
    assert ledger.excluded([there]) == {}
    assert ledger.usable([there], 1) == [there]
    assert set(ledger.excluded([here])) == {"node4"}
    [entry] = ledger.entries()
    assert (entry.host, entry.node) == ("node4", "127.0.0.4:22")
    assert ledger.clear("127.0.0.4:22") == ["node4"]


def test_39_4_an_old_ledger_keyed_by_alias_still_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    (tmp_path / "bad-nodes.json").write_text(json.dumps({"nodes": {"node4": {
        "host": "node4", "why": "lost", "detail": "x", "since": time.time(),
        "until": time.time() + 60, "job": ""}}}))
    assert set(ledger.excluded([Host("node4", "127.0.0.4", 22)])) == {"node4"}
    assert ledger.clear("node4") == ["node4"]


@pytest.mark.parametrize("log_dir", ["", "  "])
def test_40_12_an_empty_log_dir_is_refused_in_one_line(tmp_path, log_dir):
    (tmp_path / "x.py").write_text("")
    res = fluidctl(tmp_path, "train", "--log-dir", log_dir, "--dry-run", "x.py")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: --log-dir is empty") and res.stderr.count("\n") <= 2
    assert not any(tmp_path.glob("launch.log"))


def test_39_4_another_clusters_node_of_the_same_alias_is_not_left_out(tmp_path, monkeypatch):
    """The ledger holds node4 at 127.0.0.4; a job whose ssh config sends node4 to 127.0.0.5
    tries that node (nothing listens on port 1 there), one that sends node4 to 127.0.0.4
    leaves it out."""
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    (tmp_path / "x.py").write_text("")
    for address, left_out in (("127.0.0.5", False), ("127.0.0.4", True)):
        config = tmp_path / f"ssh_config.{address}"
        config.write_text(f"Host node4\n  HostName {address}\n  Port 1\n")
        ledger.record(Host("node4", "127.0.0.4", 1), ledger.LOST, "no heartbeat for 3.1s")
        res = fluidctl(tmp_path, "train", "--hosts", "node4", "--ssh-config", str(config),
                       "--dry-run", "x.py")
        assert "Traceback" not in res.stderr and res.returncode != 0, res.stderr
        if left_out:
            assert res.stderr.startswith("error: 1 of 1 node(s) are in the bad-node ledger "
                                         "(node4)"), res.stderr
        else:
            assert "bad-node ledger" not in res.stderr, res.stderr
            assert f"connection refused at {address}:1" in res.stderr, res.stderr


def test_40_9_a_fifo_at_the_ledger_or_its_lock_hangs_nothing(tmp_path):
    """A FIFO where the ledger is: a warning, read as empty (no open() that waits for a
    writer); a FIFO where its lock is: one line naming it and how to fix it, exit 2."""
    os.mkfifo(tmp_path / "bad-nodes.json")
    res = fluidctl(tmp_path, "cluster", "ledger", "list")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "is not a regular file (a FIFO)" in res.stderr
    assert "the bad-node ledger is empty" in res.stdout
    os.unlink(tmp_path / "bad-nodes.json")
    lock = tmp_path / "bad-nodes.json.lock"
    if lock.exists():
        lock.unlink()
    os.mkfifo(lock)
    res = fluidctl(tmp_path, "cluster", "ledger", "clear")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "bad-nodes.json.lock" in res.stderr, res.stderr
