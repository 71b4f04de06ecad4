"""Nodes lost while a job runs (namespace nodes, tests/netns.py), three 2-node jobs side by side,
each hung once its rank 0 is ready by a fault on its second node:

- its link cut: a partition. The node's agent goes silent and a new TCP connection to it is
  not accepted.
- every process on it frozen by the cgroup freezer (a kernel or hypervisor stall): a frozen
  node. Its agent goes silent, but a new TCP connection is accepted (by its kernel) and nothing
  answers on it. Once thawed, nothing fluidctl started is left on it.
- the path between its two nodes cut, each node's link to the launcher up: stuck. Both ranks
  wait in the same collective, both agents answer, and the ranks' connection carries nothing.

The other rank waits in its collective; the report names the rank, the node and the evidence
within --hang-timeout + 10 s of the fault.

Beside them, two jobs without --hang-timeout, a link cut and a node frozen: the launcher finds
the node by its SSH connection (keepalives unanswered), and one probe of the node's link names
the class in the failure report, as the hang report would."""
import json
import re
import time

from launchutil import start_fluidctl, wait_for
from troubleutil import TROUBLE, hang_stamps

TIMEOUT = 3
WAITS = r"rank 0 waits in broadcast #\d+ \(trouble\.py:\d+\)"


def test_a_cut_link_a_frozen_node_and_a_cut_path_are_named(tmp_path, netns_nodes):
    nodes = netns_nodes(10)
    faults = {"cut": ("node2", nodes.link_down), "frozen": ("node4", nodes.freeze),
              "path": ("node6", lambda alias: nodes.cut_between("node5", alias)),
              "cut-lost": ("node8", nodes.link_down), "frozen-lost": ("node10", nodes.freeze)}
    sshd = {alias: set(nodes.pids(alias)) for alias in nodes.nodes}
    jobs = {}
    for k, name in enumerate(faults):
        hosts = tmp_path / f"hosts-{name}"
        hosts.write_text(f"node{2 * k + 1} slots=1\nnode{2 * k + 2} slots=1\n")
        log = tmp_path / name
        watch = [] if name.endswith("-lost") else ["--hang-timeout", TIMEOUT]
        jobs[name] = (start_fluidctl("train", "--hostfile", hosts, "--ssh-config", nodes.config,
                                     *watch, "--log-dir", log, TROUBLE, "busy", 600,
                                     cwd=tmp_path), log)
    done, lost = {}, {}
    try:
        for k, (name, (job, log)) in enumerate(jobs.items()):
            first = log / f"node{2 * k + 1}" / "workerlog.0"
            wait_for(lambda: first.exists() and "rank 0 ready" in first.read_text(), timeout=60,
                     what=f"rank 0 of {name} ready")
        start, at = {}, {}
        for name, (alias, fault) in faults.items():
            fault(alias)
            start[name], at[name] = time.monotonic(), time.time()
        try:
            for name, (job, log) in jobs.items():
                _, err = job.communicate(timeout=120)
                took = time.monotonic() - start[name]
                record = json.loads((log / "failure.json").read_text())
                if name.endswith("-lost"):
                    lost[name] = (job.returncode, err, record["first_failure"])
                    continue
                said = hang_stamps(log)["classified"] - at[name]   # launch.log: whole seconds
                done[name] = (job.returncode, err, took, record["hang"], said)
        finally:
            nodes.thaw("node4")
            nodes.thaw("node10")
    finally:
        for job, _ in jobs.values():
            job.kill()
    code, err, first = lost["cut-lost"]
    assert code != 0 and "SSH connection lost" in err, err
    assert re.search(r"why: partition: node8 cannot be reached \(a new TCP connection to "
                     r"[\d.]+:22 failed \(timed out\)\): its link is cut or the node is down",
                     err), err
    assert first["kind"] == "partition"
    code, err, first = lost["frozen-lost"]
    address = re.escape(nodes.node("node10").address)
    assert re.search(rf"why: frozen node: node10 is alive but silent: its link is up \(a new "
                     rf"TCP connection to {address}:22 was accepted in \d+ ms\) and nothing "
                     r"answers on it \(no SSH banner within \d+s\)", err), err
    assert first["kind"] == "frozen node"

    for name, (code, err, took, hang, said) in done.items():
        assert code == 124, (name, err)
        assert said <= TIMEOUT + 10 + 1, (name, said)   # the sentence, from the fault
        assert took <= TIMEOUT + 10 + 5, (name, took)   # and the launcher's exit after it

    code, err, took, hang, said = done["cut"]
    assert re.search(r"fluidctl: the job hung: partition: rank 1 on node2 cannot be reached "
                     r"\(its node \(node2\) did not answer: nothing came from it for \d+s; "
                     r"a new TCP connection to [\d.]+:22 failed \(timed out\)\); " + WAITS,
                     err), err
    assert hang["class"] == "partition" and hang["ranks"] == [1]

    code, err, took, hang, said = done["frozen"]
    address = re.escape(nodes.node("node4").address)
    assert re.search(
        r"fluidctl: the job hung: frozen node: rank 1 on node4 is alive but silent: nothing "
        r"came from its agent for \d+s, yet its link is up \(a new TCP connection to "
        rf"{address}:22 was accepted in \d+ ms\) and nothing answers on it \(no SSH banner "
        r"within \d+s\): its processes are stopped \(a frozen cgroup, a kernel or hypervisor "
        r"stall\); " + WAITS, err), err
    assert hang["class"] == "frozen node" and hang["ranks"] == [1]
    for alias in ("node3", "node4"):          # thawed, the agent sees its launcher gone
        wait_for(lambda: set(nodes.pids(alias)) <= sshd[alias], timeout=20,
                 what=f"only sshd left on {alias}")

    code, err, took, hang, said = done["path"]
    assert re.search(r"fluidctl: the job hung: stuck: every rank waits in broadcast #\d+ "
                     r"\(trouble\.py:\d+\) on node5,node6, at most \d+% CPU: no rank is "
                     r"missing from it, its transport makes no progress \(a link or a peer's "
                     r"network\)", err), err
    assert hang["class"] == "stuck" and hang["ranks"] == [0, 1]

