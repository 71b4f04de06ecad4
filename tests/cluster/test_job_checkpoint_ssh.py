"""issue 39.12 over ssh: ``fluidctl job checkpoint LOG_DIR`` of a job on two sshd nodes. Each
node's ranks read their own node's request file (LOG_DIR/<host>/checkpoint.request), not the
launcher's, so the launcher passes the ``save`` on to every agent (launch/relay.py): every
rank saves at the same step and the job goes on; --stop saves, stops every node, exit 75."""
from pathlib import Path

import pytest

from launchutil import ROOT, fluidctl, start_fluidctl, wait_for

TRAIN = ROOT / "tests" / "scripts" / "preempt_train.py"


@pytest.fixture
def hosts(sshd_nodes):
    return sshd_nodes.hostfile("hosts.2x1", slots=1)


def _lines(path: Path):
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def _events(out: Path, rank: int):
    try:
        return (out / f"events.{rank}").read_text().split("\n")
    except FileNotFoundError:
        return []


def _start(tmp_path, sshd_nodes, hosts, steps):
    out, logs = tmp_path / "out", tmp_path / "logs"
    job = start_fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                         "--log-dir", logs, TRAIN, "--ckpt", tmp_path / "ckpt", "--out", out,
                         "--steps", steps, "--dim", 64, "--step-time", 0.02, cwd=tmp_path)
    wait_for(lambda: all(len(_lines(out / f"steps.{r}")) >= 10 for r in (0, 1)), 120,
             "ten steps on both nodes")
    return job, out, logs


def _finish(job):
    try:
        return job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


def test_save_reaches_every_node_and_the_job_goes_on(tmp_path, sshd_nodes, hosts):
    job, out, logs = _start(tmp_path, sshd_nodes, hosts, 600)
    fluidctl("job", "checkpoint", logs, cwd=tmp_path, check=0)
    wait_for(lambda: all(any(e.startswith("saved ") for e in _events(out, r)) for r in (0, 1)),
             60, "both ranks saved")
    stdout, stderr = _finish(job)
    assert job.returncode == 0, stdout + stderr
    saved = {r: [e for e in _events(out, r) if e.startswith("saved ")] for r in (0, 1)}
    assert saved[0] == saved[1] and len(saved[0]) == 1, saved
    assert all(_events(out, r)[-2] == "finished" for r in (0, 1))
    for node in ("node1", "node2"):         # each agent wrote its node's own request
        assert (logs / node / "checkpoint.request").read_text().startswith("save ")


def test_stop_saves_on_every_node_and_exits_75(tmp_path, sshd_nodes, hosts):
    job, out, logs = _start(tmp_path, sshd_nodes, hosts, 100000)
    fluidctl("job", "checkpoint", logs, "--stop", cwd=tmp_path, check=0)
    stdout, stderr = _finish(job)
    assert job.returncode == 75, stdout + stderr
    assert all(any(e.startswith("stop ") for e in _events(out, r)) for r in (0, 1))
