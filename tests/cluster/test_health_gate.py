"""The health gate and the bad-node ledger on namespace nodes (tests/netns.py) with real
faults: a CPU throttled by a cgroup quota and a link capped by tc tbf are named by
``cluster check --deep``; ``train --health-gate`` leaves them out and records them; the next
``train`` skips a ledgered node unless ``--include-bad``; ``cluster ledger list|clear``."""
import json
import time

import netns
import psutil

from launchutil import TEMPLATES, fluidctl, wait_for

HELLO = TEMPLATES / "hello.py"


def like_real_nodes(nodes):
    """Every node's cpu cgroup weighs as much as cgroup v1 allows (cpu.shares), so the other
    load of this machine's few cores does not decide the CPU figures, as on real nodes with
    cores of their own; a quota (throttle_cpu) still caps its node."""
    for alias in nodes.nodes:
        (nodes._cgroup(alias, netns.CPU) / "cpu.shares").write_text("262144")
    return nodes


def probes(nodes):
    """The deep check's probes still running on any node."""
    found = []
    for alias in nodes.nodes:
        for pid in nodes.pids(alias):
            try:
                if "fluidctl.node.healthprobe" in psutil.Process(pid).cmdline():
                    found.append(pid)
            except psutil.Error:
                pass
    return found


def test_deep_check_names_a_throttled_cpu_and_a_capped_link(tmp_path, netns_nodes):
    nodes = like_real_nodes(netns_nodes(8))
    nodes.throttle_cpu("node3", 0.1)
    nodes.cap_link("node6", "10mbit")
    started = time.monotonic()
    res = fluidctl("cluster", "check", "--deep", "--json", "--hostfile", nodes.hostfile(),
                   "--ssh-config", nodes.config, cwd=tmp_path, timeout=60)
    took = time.monotonic() - started
    assert res.returncode == 1 and res.stdout, res.stdout + res.stderr
    report = {n["host"]: n for n in json.loads(res.stdout)["nodes"]}
    named = {host: n["outliers"] for host, n in report.items() if n["outliers"]}
    assert sorted(named) == ["node3", "node6"], named
    assert any(line.startswith("node3: CPU GEMM ") for line in named["node3"]), named
    assert any(line.startswith("node6: network ") for line in named["node6"]), named
    assert all(not n["reason"] for n in report.values())
    assert report["node6"]["figures"]["net_gbps"] < 0.02        # 10 mbit/s, as capped
    assert took < 30, took
    assert res.stderr.startswith("error: 2 of 8 node(s) failed the deep check: node3, node6")
    wait_for(lambda: not probes(nodes), 5, "the probes to exit")  # nothing outlives the check


def test_health_gate_leaves_outliers_out_and_the_ledger_keeps_them_out(tmp_path, netns_nodes):
    nodes = like_real_nodes(netns_nodes(4))
    state = {"FLUIDCTL_STATE_DIR": str(tmp_path / "state")}
    common = ["--hostfile", nodes.hostfile(), "--ssh-config", nodes.config]
    nodes.throttle_cpu("node2", 0.1)
    res = fluidctl("train", *common, "--health-gate", "--nodes", 3, "--tee", "all", HELLO,
                   cwd=tmp_path, env=state, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "health gate: leaving out node2 (CPU GEMM " in res.stderr, res.stderr
    assert "/3 " in res.stdout and "node2" not in res.stdout        # 3 ranks, not on node2
    (nodes._cgroup("node2", netns.CPU) / "cpu.cfs_quota_us").write_text("-1")   # well again

    res = fluidctl("cluster", "ledger", "list", "--json", cwd=tmp_path, env=state, check=0)
    [entry] = json.loads(res.stdout)
    assert (entry["host"], entry["why"]) == ("node2", "health")
    assert entry["detail"].startswith("CPU GEMM ") and entry["until"] > time.time()

    res = fluidctl("train", *common, "--dry-run", "--json", HELLO, cwd=tmp_path, env=state)
    assert res.returncode == 0, res.stderr
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == ["node1", "node3", "node4"]
    [note] = res.stderr.splitlines()
    assert note.startswith("note: leaving out 1 node(s) in the bad-node ledger: node2 (health, "
                           "CPU GEMM ") and "--include-bad" in note, note

    res = fluidctl("train", *common, "--include-bad", "--dry-run", "--json", HELLO,
                   cwd=tmp_path, env=state, check=0)
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == [
        "node1", "node2", "node3", "node4"]

    res = fluidctl("train", *common, "--nodes", 4, "--dry-run", HELLO, cwd=tmp_path, env=state)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("error: 1 of 4 node(s) are in the bad-node ledger (node2): 3 left, 4 "
                          "required (pass --include-bad to use them, or forget them with "
                          "fluidctl cluster ledger clear HOST)\n")

    assert fluidctl("cluster", "ledger", "clear", "node2", cwd=tmp_path, env=state,
                    check=0).stdout == "forgot 1 node(s): node2\n"
    res = fluidctl("cluster", "ledger", "clear", "node2", cwd=tmp_path, env=state, check=2)
    assert res.stderr.startswith("error: node2 is not in the bad-node ledger")
    assert json.loads(fluidctl("cluster", "ledger", "list", "--json", cwd=tmp_path, env=state,
                               check=0).stdout) == []
