"""Checkpoint requests reach the ranks of remote nodes (the ssh backend, the two loopback sshd
nodes of the sshd_nodes fixture): SIGUSR1 to ``fluidctl train`` makes the launcher tell every
node agent, which creates its node's request file (FLUIDCTL_CHECKPOINT_REQUEST of its ranks)
and sends --checkpoint-signal to its ranks; every rank commits at the same step, exits 0, and
fluidctl exits 75."""
import signal

from launchutil import ROOT, start_fluidctl, wait_for

SCRIPT = ROOT / "tests" / "scripts" / "preempt_train.py"
WORLD = 4


def test_sigusr1_every_remote_rank_commits_at_one_step(tmp_path, sshd_nodes):
    hosts = sshd_nodes.hostfile("hosts.2x2", slots=2)
    out, log = tmp_path / "out", tmp_path / "log"
    proc = start_fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                          "--log-dir", log, "--checkpoint-signal", "USR2", SCRIPT,
                          "--ckpt", tmp_path / "ck", "--out", out, "--steps", 400,
                          "--dim", 1000, "--step-time", 0.02, cwd=tmp_path)
    last = out / f"steps.{WORLD - 1}"
    wait_for(lambda: proc.poll() is not None or (last.exists() and
                                                 len(last.read_text().split()) >= 10),
             90, "10 steps on every node")
    proc.send_signal(signal.SIGUSR1)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stdout + stderr
    events = [(out / f"events.{r}").read_text().split("\n")[:-1] for r in range(WORLD)]
    saved = {e for ev in events for e in ev if e.startswith("saved")}
    assert len(saved) == 1, events                  # one step, the same on every rank
    step = int(saved.pop().split()[1])
    assert all(ev[-1] == f"stop {step}" for ev in events), events
    assert f"every rank exited on the checkpoint request after committing step {step}" in \
        stdout + stderr
    for node in ("node1", "node2"):         # each agent made its node's file, sent USR2
        said = (log / f"launch.{node}.log").read_text()
        assert f"checkpoint requested by the launcher: {log / node / 'checkpoint.request'}, " \
               "SIGUSR2 to the ranks" in said, said
        assert (log / node / "checkpoint.request").read_text().startswith("stop ")
