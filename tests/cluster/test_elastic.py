"""Elastic membership (``fluidctl train --nodes MIN:MAX``) on namespace nodes with real faults
(tests/elasticrun.py): the job goes on in a new world (survivors plus spares, MASTER_ADDR
moved when its node went), resumes from its checkpoints and ends with the weights of the
reference for the world sequence it ran; detection and first-step times are measured (printed,
not asserted: the goal is 5 s); no node holds anything but sshd afterwards."""
from elasticrun import Fault, run_elastic


def check(outcome, worlds):
    assert outcome.code == 0, outcome.out
    assert outcome.weights is not None and outcome.weights == outcome.reference, outcome.out
    assert sorted(set(outcome.worlds), reverse=True) == worlds, outcome.worlds
    assert outcome.leftovers == {}
    for fault in outcome.faults:
        assert fault.detected is not None and fault.first_step is not None, fault
        print(f"{fault.kind} on {','.join(fault.hit)}: lost after {fault.detected:.2f}s, "
              f"first step of the new world {fault.first_step:.2f}s after the fault")


def test_agent_killed_then_master_node_cut_off_beside_a_node_at_full_cpu(netns_nodes,
                                                                          tmp_path):
    nodes = netns_nodes(4)
    outcome = run_elastic(nodes, tmp_path, node_range="2:3", steps=40, faults=[
        Fault(8, "agent-kill", ("node2",)), Fault(20, "link-down", ("master",))],
        loaded=("node3",))
    check(outcome, [3, 2])
    assert [f.hit for f in outcome.faults] == [("node2",), ("node1",)]
    out = outcome.out
    assert "node node2 lost: its agent was killed" in out
    assert "restart 1: new world of 3 trainer(s) on node1, node3, node4" in out   # a spare
    assert "node node1 lost: no heartbeat from its agent for 3." in out
    assert "restart 2: new world of 2 trainer(s) on node3, node4, MASTER_ADDR 198.18." in out
    assert "node node3 lost" not in out         # at 100% CPU all along: slow, not lost
    # the contract of each world: restart counts, MASTER_ADDR on a surviving node
    starts = [s.split(" t ")[0] for s in outcome.starts]
    assert starts[0].startswith("start 0 world 3 restart 0 torch 0 master ")
    # each new world resumes from the last step done before its fault (injected once step 8,
    # then 20, was done: a step or so later on a busy machine)
    for start, fault, world in ((starts[1], outcome.faults[0], "world 3 restart 1 torch 1"),
                                (starts[2], outcome.faults[1], "world 2 restart 2 torch 2")):
        step = int(start.split()[1])
        assert fault.at_step <= step <= fault.step + 1 and \
            start.startswith(f"start {step} {world} master "), (start, fault.step)
    assert starts[2].endswith(nodes.node("node3").address)
    # the console follows rank 0 to node3, and endpoints.log names the world that ran last
    assert "elastic_train done: 40 steps, world 2" in out
    endpoints = (tmp_path / "mylog" / "endpoints.log").read_text()
    assert [line.split()[2] for line in endpoints.splitlines() if line.startswith("trainer ")
            ] == [nodes.node("node3").address, nodes.node("node4").address], endpoints


def test_two_frozen_nodes_then_a_node_lost_during_the_restart(netns_nodes, tmp_path):
    nodes = netns_nodes(5)
    outcome = run_elastic(nodes, tmp_path, node_range="2:3", steps=30, faults=[
        Fault(8, "freeze", ("master", "node2")),
        Fault(0, "link-down", ("node4",), during_restart=True)])
    check(outcome, [3, 2])
    out = outcome.out
    for alias in ("node1", "node2", "node4"):
        assert f"node {alias} lost: " in out
    assert outcome.worlds[-1] == 2 and "on node3, node5, MASTER_ADDR" in out


def test_fabric_agent_killed_the_spare_takes_its_place(netns_nodes, tmp_path):
    """The fabric launcher shares the elastic coordinator: a lost node, a spare in its place."""
    nodes = netns_nodes(3)
    outcome = run_elastic(nodes, tmp_path, node_range="2:2", steps=16, backend="fabric",
                          faults=[Fault(6, "agent-kill", ("node2",))])
    check(outcome, [2])
    assert "node node2 lost: its agent was killed" in outcome.out
    assert "restart 1: new world of 2 trainer(s) on node1, node3" in outcome.out
    # the same, once each, as events (fluidctl/telemetry) in the events file and launch.log
    from fluidctl.telemetry import from_record, read_events
    events = [from_record(r) for r in read_events(tmp_path / "mylog" / "events.jsonl")]
    lost = [e for e in events if e.KIND == "node_lost"]
    worlds = [e for e in events if e.KIND == "world"]
    assert [e.host for e in lost] == ["node2"] and "agent was killed" in lost[0].why
    assert [(w.attempt, w.hosts) for w in worlds] == [(1, ("node1", "node3"))]
    launch = (tmp_path / "mylog" / "launch.log").read_text()
    assert all(launch.count(e.log_line()) == 1 for e in lost + worlds), launch


def test_40_15_a_node_frozen_for_a_moment_rejoins_and_leaves_the_ledger(netns_nodes, tmp_path):
    """A node frozen for 6 s is lost (the job goes on with 2 of MAX 3), then answers again:
    it passes its probe, rejoins in a new world of 3 (not a failure: --max-restarts 1 is
    left for one) and its ledger entry is lifted."""
    import json
    import subprocess
    import sys
    nodes = netns_nodes(3)
    outcome = run_elastic(nodes, tmp_path, node_range="2:3", steps=80, pause=0.25,
                          max_restarts=1, faults=[Fault(8, "freeze", ("node2",), heal_after=6)])
    check(outcome, [3, 2])
    out = outcome.out
    assert "node node2 lost: " in out
    assert "restart 1: new world of 2 trainer(s) on node1, node3" in out
    assert "node node2 answers again and passed its probe: it rejoins" in out
    assert "new world of 3 trainer(s) on node1, node3, node2" in out
    assert outcome.worlds[-1] == 3, outcome.worlds
    listed = subprocess.run([sys.executable, "-m", "fluidctl", "cluster", "ledger", "list",
                             "--json"], capture_output=True, text=True, timeout=60,
                            env={**__import__("os").environ,
                                 "FLUIDCTL_STATE_DIR": str(tmp_path / "state")})
    assert json.loads(listed.stdout) == [], listed.stdout
