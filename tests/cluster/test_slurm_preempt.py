"""Preemption, time limits and requeue on the real Slurm of tests/slurm.py (slurmctld + 2
slurmd): a 2 x 2 float64 job (tests/scripts/preempt_train.py) submitted with ``fluidctl train
--backend slurm`` is asked for a checkpoint by ``scancel --signal=USR1``, by its time limit's
warning signal (``--time 1 --checkpoint-warning 45``) or stopped by ``scontrol requeue``; every
rank commits at the same step, Slurm runs the job again and it resumes there. Every rank logs
each optimizer step: none is lost or repeated, and the final weights are an uninterrupted
run's (tolerance 1e-9)."""
import json
import re
import subprocess
import sys

import numpy as np

from launchutil import ROOT, wait_for

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from preempt_train import reference  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "preempt_train.py"
WORLD, DIM = 4, 1000


def fluidctl(slurm, tmp_path, *args, timeout=60):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def submit(slurm, tmp_path, steps, step_time, *options, script_args=()):
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--nproc", 2,
                   "--detach", "--log-dir", tmp_path / "log", *options, SCRIPT,
                   "--ckpt", tmp_path / "ck", "--out", tmp_path / "out", "--steps", steps,
                   "--dim", DIM, "--step-time", step_time, *script_args)
    assert res.returncode == 0, res.stderr
    return re.search(r"submitted Slurm job (\d+)", res.stderr).group(1)


def job_field(slurm, job_id, name):
    text = slurm.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
    found = re.search(rf"\b{name}=(\S+)", text)
    return found.group(1) if found else ""


def steps_of(tmp_path, rank):
    try:
        return [int(s) for s in (tmp_path / "out" / f"steps.{rank}").read_text().split()]
    except FileNotFoundError:
        return []


def events(tmp_path, rank):
    return (tmp_path / "out" / f"events.{rank}").read_text().split("\n")[:-1]


def finish(slurm, tmp_path, job_id, steps, timeout):
    """Wait for the job to complete, then: every step once on every rank, the same resume
    point everywhere, the uninterrupted run's weights. Returns the steps resumed from."""
    wait_for(lambda: job_field(slurm, job_id, "JobState") in ("COMPLETED", "FAILED",
                                                                 "CANCELLED", "TIMEOUT"),
             timeout, f"job {job_id} to end")
    assert job_field(slurm, job_id, "JobState") == "COMPLETED", \
        (tmp_path / "log" / f"slurm-{job_id}.out").read_text()
    resumed = [[e for e in events(tmp_path, r) if e.startswith("resumed")]
               for r in range(WORLD)]
    assert resumed[0] and all(r == resumed[0] for r in resumed), resumed
    for rank in range(WORLD):
        assert steps_of(tmp_path, rank) == list(range(steps)), rank   # none lost, none twice
    final = np.load(tmp_path / "out" / "final.npy")
    np.testing.assert_allclose(final, reference(WORLD, steps, DIM), rtol=0, atol=1e-9)
    return [int(e.split()[1]) for e in resumed[0]]


def test_scancel_signal_usr1_requeues_and_resumes(slurm, tmp_path):
    job_id = submit(slurm, tmp_path, 60, 0.05)
    wait_for(lambda: len(steps_of(tmp_path, WORLD - 1)) >= 10, 60, "10 steps")
    slurm.run("scancel", "--signal=USR1", job_id)        # to the ranks, as a preemption
    resumed = finish(slurm, tmp_path, job_id, 60, 90)
    assert job_field(slurm, job_id, "Restarts") == "1"
    status = fluidctl(slurm, tmp_path, "job", "status", job_id)
    assert "requeued: 1 time(s)" in status.stdout, status.stdout
    assert f"last checkpoint: step {resumed[0]} " in status.stdout
    row = json.loads(fluidctl(slurm, tmp_path, "job", "status", job_id, "--json").stdout)
    assert row["requeues"] == 1 and row["checkpoint_step"] == resumed[0]


def test_time_limit_warning_checkpoints_and_requeues(slurm, tmp_path):
    """--time 1 --checkpoint-warning 45: slurmctld checks time limits every 30 s (fixed in
    Slurm 22.05) and sends the warning at the first check that finds the end within warning
    + 30 s, which here is the first check after the start: USR1 to the batch shell 0 to 30 s
    in, forwarded to fluidctl, which asks every rank; the job is requeued (with a new time
    limit) as often as it takes. 300 steps of 0.12 s outlast the first check; the steps left
    after a resume take 0.01 s each, so the resumed run does not wait as long again."""
    job_id = submit(slurm, tmp_path, 300, 0.12, "--time", 1, "--checkpoint-warning", 45,
                    script_args=("--resumed-step-time", 0.01))
    script = (tmp_path / "log" / f"slurm-{job_id}.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@45\n#SBATCH --requeue\n" in script
    finish(slurm, tmp_path, job_id, 300, 300)
    assert int(job_field(slurm, job_id, "Restarts")) >= 1


def test_scontrol_requeue_resumes(slurm, tmp_path):
    """scontrol requeue: Slurm sends SIGTERM to every process of the job, KillWait (5 s)
    before SIGKILL: the ranks trap it, commit at one step, and the requeued job resumes."""
    job_id = submit(slurm, tmp_path, 60, 0.05)
    wait_for(lambda: len(steps_of(tmp_path, WORLD - 1)) >= 10, 60, "10 steps")
    slurm.run("scontrol", "requeue", job_id)
    finish(slurm, tmp_path, job_id, 60, 90)
    assert job_field(slurm, job_id, "Restarts") == "1"


def test_time_limit_inside_an_allocation(slurm, tmp_path):
    """Inside an allocation (salloc --time=1) fluidctl reads the job's end from Slurm and asks
    for a checkpoint --checkpoint-warning seconds before it: every rank commits the same step
    (no step after it), fluidctl exits 75."""
    alloc = slurm.allocate(2, 2, "--time=1")
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **alloc)
    argv = [sys.executable, "-m", "fluidctl", "train", "--backend", "slurm", "--log-dir",
            tmp_path / "log", "--checkpoint-warning", 52, SCRIPT, "--ckpt", tmp_path / "ck",
            "--out", tmp_path / "out", "--steps", 400, "--dim", DIM, "--step-time", 0.05]
    first = subprocess.run(list(map(str, argv)), env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=90)
    assert first.returncode == 75, first.stderr
    assert "checkpoint requested (the time limit is near)" in first.stdout + first.stderr
    stopped = [int(e.split()[1]) for e in events(tmp_path, 0) if e.startswith("stop")]
    assert len(stopped) == 1 and 0 < stopped[0] < 399
    for rank in range(WORLD):
        assert steps_of(tmp_path, rank) == list(range(stopped[0] + 1))
