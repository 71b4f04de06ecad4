"""issue 39.12: ``fluidctl job checkpoint LOG_DIR`` for a job fluidctl runs itself: every rank
saves at the same step and the job goes on (and finishes); with --stop it saves, stops and
exits 75; a job that no longer runs is one line. (The ssh relay: tests/cluster/
test_job_checkpoint_ssh.py.)"""
from pathlib import Path

from launchutil import ROOT, fluidctl, start_fluidctl, wait_for

TRAIN = ROOT / "tests" / "scripts" / "preempt_train.py"


def _steps(out: Path, rank: int) -> int:
    try:
        return len((out / f"steps.{rank}").read_text().split())
    except FileNotFoundError:
        return 0


def _events(out: Path, rank: int):
    try:
        return (out / f"events.{rank}").read_text().split("\n")
    except FileNotFoundError:
        return []


def _start(tmp_path, steps: int, *backend):
    out, logs = tmp_path / "out", tmp_path / "logs"
    job = start_fluidctl("train", *backend, "--nproc", 2, "--log-dir", logs, TRAIN, "--ckpt",
                         tmp_path / "ckpt", "--out", out, "--steps", steps, "--dim", 64,
                         "--step-time", 0.02, cwd=tmp_path)
    wait_for(lambda: _steps(out, 0) >= 10 and _steps(out, 1) >= 10, 60, "ten steps")
    return job, out, logs


def _finish(job):
    try:
        return job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


def test_save_and_go_on(tmp_path):
    _save_and_go_on(tmp_path)


def test_save_and_go_on_under_mpirun(tmp_path, openmpi):
    _save_and_go_on(tmp_path, "--backend", "mpi")


def _save_and_go_on(tmp_path, *backend):
    job, out, logs = _start(tmp_path, 400, *backend)
    asked = fluidctl("job", "checkpoint", logs, cwd=tmp_path)
    if asked.returncode:
        _finish(job)
    assert "every rank saves at the same step and goes on" in asked.stdout, asked
    wait_for(lambda: all(any(e.startswith("saved ") for e in _events(out, r))
                         for r in (0, 1)), 60, "both ranks saved")
    stdout, stderr = _finish(job)
    assert job.returncode == 0, stdout + stderr
    saved = {r: [e for e in _events(out, r) if e.startswith("saved ")] for r in (0, 1)}
    assert saved[0] == saved[1] and len(saved[0]) == 1, saved      # the same step, once
    for r in (0, 1):
        assert _events(out, r)[-2] == "finished", _events(out, r)  # and it went on
    assert (tmp_path / "out" / "final.npy").exists()


def test_stop_saves_and_exits_75_and_a_finished_job_is_one_line(tmp_path):
    job, out, logs = _start(tmp_path, 100000)
    asked = fluidctl("job", "checkpoint", logs, "--stop", cwd=tmp_path)
    stdout, stderr = _finish(job)
    assert "then the job stops with exit 75" in asked.stdout, asked
    assert job.returncode == 75, stdout + stderr
    for r in (0, 1):
        assert any(e.startswith("stop ") for e in _events(out, r)), _events(out, r)
    gone = fluidctl("job", "checkpoint", logs, cwd=tmp_path)
    assert gone.returncode == 2 and gone.stderr.startswith(f"error: no running job in {logs}")
    assert len(gone.stderr.strip().splitlines()) == 1, gone.stderr
