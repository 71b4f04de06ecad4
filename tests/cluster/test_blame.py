"""Blame needs node evidence (docs/blame.md), on the two loopback sshd nodes (tests/sshd.py)
of an elastic job (--nodes 2:2): a launcher stopped for 8 s (SIGSTOP, as Ctrl-Z or a paused VM
would) and ranks SIGKILLed (a user's kill -9, the job's own OOM) leave the bad-node ledger
empty, and the job goes on on the same nodes."""
import json
import os
import signal
import subprocess
import sys
import time

from launchutil import ROOT, start_fluidctl, wait_for

SCRIPT = ROOT / "tests" / "scripts" / "blame_steps.py"


def ledger_hosts(state) -> list:
    res = subprocess.run([sys.executable, "-m", "fluidctl", "cluster", "ledger", "list",
                          "--json"], env={**os.environ, "FLUIDCTL_STATE_DIR": str(state)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [e["host"] for e in json.loads(res.stdout)]


def elastic_job(sshd_nodes, tmp_path, mode: str, seconds: float):
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    proc = start_fluidctl("train", "--hostfile", sshd_nodes.hostfile(), "--ssh-config",
                          sshd_nodes.config, "--nodes", "2:2", "--max-restarts", 1,
                          "--log-dir", tmp_path / "log", SCRIPT, out, mode, seconds,
                          cwd=tmp_path, env={"FLUIDCTL_STATE_DIR": str(state)})
    return proc, out, state


def test_40_4_a_launcher_stopped_for_8s_ledgers_no_node(sshd_nodes, tmp_path):
    proc, out, state = elastic_job(sshd_nodes, tmp_path, "work", 20)
    try:
        wait_for(lambda: proc.poll() is not None or all(
            (out / f"beat.{r}").exists() for r in (0, 1)), 60, "both ranks working")
        assert proc.poll() is None
        proc.send_signal(signal.SIGSTOP)
        time.sleep(8)                       # the fault itself: the launcher stopped 8 s
        proc.send_signal(signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    said = stdout + stderr
    assert "lost" not in stderr, said
    assert ledger_hosts(state) == [], said
    assert "the launcher itself was stopped" in (tmp_path / "log" / "launch.log").read_text()
    assert proc.returncode == 0, said


def test_40_5_sigkilled_ranks_ledger_no_node_and_rerun_on_the_same_nodes(sshd_nodes,
                                                                         tmp_path):
    proc, out, state = elastic_job(sshd_nodes, tmp_path, "kill", 1)
    stdout, stderr = proc.communicate(timeout=120)
    said = stdout + stderr
    assert proc.returncode == 0, said
    assert ledger_hosts(state) == [], said
    assert {p.name for p in out.glob("started.*.1")} == {"started.0.1", "started.1.1"}, said
    assert "restart 1: new world of 2 trainer(s) on node1, node2" in said


def test_40_12_a_node_lost_on_the_last_allowed_attempt_is_ledgered(sshd_nodes, tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    proc = start_fluidctl("train", "--hostfile", sshd_nodes.hostfile(), "--ssh-config",
                          sshd_nodes.config, "--nodes", "2:2", "--log-dir", tmp_path / "log",
                          SCRIPT, out, "work", 30, cwd=tmp_path,
                          env={"FLUIDCTL_STATE_DIR": str(state)})
    try:
        wait_for(lambda: proc.poll() is not None or all(
            (out / f"beat.{r}").exists() for r in (0, 1)), 60, "both ranks working")
        agent = wait_for(lambda: sshd_nodes.agent_pids("node2", running=True), 10,
                         "node2's agent that runs its rank")    # not the standby one
        os.kill(agent[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 137, stdout + stderr        # the agent's SIGKILL
    assert ledger_hosts(state) == ["node2"], stdout + stderr
    assert "node node2 lost: its agent was killed (recorded in the ledger of bad nodes)" in \
        stderr
