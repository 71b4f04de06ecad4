"""A node lost while the job runs (namespace nodes, tests/netns.py): its link cut (a partition)
or every process on it frozen by the cgroup freezer (a kernel or hypervisor stall). The ranks on
the other node wait in their allreduce; the lost node's agent goes silent, and the hang report
names its rank, the node and what a new TCP connection to it shows: none accepted (cut), or one
accepted that nothing answers (frozen)."""
import json
import re
import time

from launchutil import start_fluidctl, wait_for
from troubleutil import TROUBLE

TIMEOUT = 3


def hang_after(tmp_path, nodes, fault, undo=lambda: None):
    """A 2-node job hung by ``fault()`` once rank 0 is ready: (stderr, seconds from the fault
    to the launcher's exit, failure.json's hang record)."""
    log = tmp_path / "log"
    job = start_fluidctl("train", "--hostfile", nodes.hostfile(), "--ssh-config", nodes.config,
                         "--hang-timeout", TIMEOUT, "--log-dir", log, TROUBLE, "busy", 600,
                         cwd=tmp_path)
    try:
        first = log / "node1" / "workerlog.0"
        wait_for(lambda: first.exists() and "rank 0 ready" in first.read_text(), timeout=60,
                 what="rank 0 ready")
        fault()
        start = time.monotonic()
        try:
            _, err = job.communicate(timeout=120)
        finally:
            undo()
        took = time.monotonic() - start
    finally:
        job.kill()
    assert job.returncode == 124, err
    assert took <= TIMEOUT + 10 + 5, took      # + the wait for the lost node's answer
    return err, json.loads((log / "failure.json").read_text())["hang"]


def test_a_cut_link_is_a_partition_naming_the_node(tmp_path, netns_nodes):
    nodes = netns_nodes(2)
    err, hang = hang_after(tmp_path, nodes, lambda: nodes.link_down("node2"))
    assert re.search(r"fluidctl: the job hung: partition: rank 1 on node2 cannot be reached "
                     r"\(its node \(node2\) did not answer: nothing came from it for \d+s; "
                     r"a new TCP connection to [\d.]+:22 failed \(timed out\)\); "
                     r"rank 0 waits in broadcast #\d+ \(trouble\.py:\d+\)", err), err
    assert hang["class"] == "partition" and hang["ranks"] == [1]


def test_a_frozen_node_is_named_with_its_evidence_and_left_clean_after_thaw(tmp_path,
                                                                             netns_nodes):
    nodes = netns_nodes(2)
    sshd = {alias: set(nodes.pids(alias)) for alias in ("node1", "node2")}
    err, hang = hang_after(tmp_path, nodes, lambda: nodes.freeze("node2"),
                           lambda: nodes.thaw("node2"))
    address = re.escape(nodes.node("node2").address)
    assert re.search(
        r"fluidctl: the job hung: frozen node: rank 1 on node2 is alive but silent: nothing "
        r"came from its agent for \d+s, yet its link is up \(a new TCP connection to "
        rf"{address}:22 was accepted in \d+ ms\) and nothing answers on it \(no SSH banner "
        r"within \d+s\): its processes are stopped \(a frozen cgroup, a kernel or hypervisor "
        r"stall\); rank 0 waits in broadcast #\d+ \(trouble\.py:\d+\)", err), err
    assert hang["class"] == "frozen node" and hang["ranks"] == [1]
    for alias in ("node1", "node2"):          # thawed, the agent sees its launcher gone
        wait_for(lambda: set(nodes.pids(alias)) <= sshd[alias], timeout=20,
                 what=f"only sshd left on {alias}")
