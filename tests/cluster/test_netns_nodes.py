"""The namespace-node fixture itself (tests/netns.py): own addresses, sshd in each, faults that
act like real ones, and nothing left behind."""
import subprocess
import time

import netns


def ssh(nodes, alias, command, timeout=10):
    return subprocess.run(["ssh", "-F", str(nodes.config), "-o", "ConnectTimeout=2",
                           "-o", "BatchMode=yes", alias, command],
                          capture_output=True, text=True, timeout=timeout)


def test_nodes_have_their_own_addresses_and_sshd_and_see_each_other(netns_nodes):
    nodes = netns_nodes(3)
    res = ssh(nodes, "node2", "ip -4 -o addr show eth0; ip route")
    assert res.returncode == 0, res.stderr
    assert nodes.node("node2").address in res.stdout
    assert "default" not in res.stdout                  # no route out of the bridge
    res = ssh(nodes, "node1", f"python3 -c \"import socket; socket.create_connection(('{nodes.node('node3').address}', 22), 2); print('ok')\"")
    assert res.stdout.strip() == "ok", res.stderr


def test_link_down_cuts_the_node_and_freeze_silences_it(netns_nodes):
    nodes = netns_nodes(2)
    nodes.link_down("node1")
    assert ssh(nodes, "node1", "true", timeout=15).returncode != 0
    nodes.link_up("node1")
    assert ssh(nodes, "node1", "true").returncode == 0
    nodes.freeze("node2")
    start = time.monotonic()
    try:
        subprocess.run(["ssh", "-F", str(nodes.config), "-o", "BatchMode=yes", "node2", "true"],
                       capture_output=True, timeout=3)
        frozen = False
    except subprocess.TimeoutExpired:
        frozen = True                                   # TCP accepts, sshd never answers
    assert frozen and time.monotonic() - start >= 3
    nodes.thaw("node2")
    assert ssh(nodes, "node2", "true").returncode == 0


def test_stop_removes_every_namespace_link_and_cgroup(tmp_path):
    why = netns.available()
    if why:
        import pytest
        pytest.skip(why)
    nodes = netns.NetnsNodes.start(tmp_path, 2)
    names = [n.netns for n in nodes.nodes.values()] + [nodes.bridge]
    nodes.stop()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(name in listed or name in links for name in names)
    assert not list(netns.FREEZER.glob(f"{netns.PREFIX}{nodes.fid}*"))
