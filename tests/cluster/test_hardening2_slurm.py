"""Issue 27 (hardening), Slurm: a cancel ends a restarting follower (#2); a job's end is kept
in its record once Slurm forgets it, and the exit file ends a job that Slurm keeps COMPLETING
because a slurmd died (#14). Against the real Slurm of tests/slurm.py."""
import json
import re
import signal
import subprocess
import sys

import psutil
import pytest

from launchutil import BEHAVE, alive, read_pids, wait_for


def fluidctl(slurm, tmp_path, *args, timeout=120):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def start_fluidctl(slurm, tmp_path, *args):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    return subprocess.Popen([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def submitted_ids(path):
    """Job ids the follower has announced so far (its stderr, read from a file)."""
    return re.findall(r"submitted Slurm job (\d+)", path.read_text())


def follow_in_background(slurm, tmp_path, *args):
    err = tmp_path / "follower.err"
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    with open(err, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=f, text=True)
    return proc, err


def stop(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def squeue_state(slurm, job_id):
    return slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()


def forget(tmp_path, job_id):
    """What `job status` sees once slurmctld has purged the job (MinJobAge; no sacct here):
    the same record and log dir under an id slurmctld never had."""
    gone = str(90_000_000 + int(job_id) % 1_000_000)
    record = json.loads(paths_record(tmp_path, job_id).read_text())
    record["job_id"] = gone
    paths_record(tmp_path, gone).write_text(json.dumps(record))
    return gone


def paths_record(tmp_path, job_id):
    return tmp_path / "state" / "jobs" / f"slurm-{job_id}.json"


# --- #2: a cancel is not a failure ----------------------------------------------------------
@pytest.mark.parametrize("how", ["fluidctl job cancel", "scancel"])
def test_27_2_cancel_stops_a_restarting_follower(slurm, tmp_path, how):
    """A job cancelled by ``fluidctl job cancel`` or a user's own scancel ends its follower:
    never resubmitted, however many restarts are left."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc, err = follow_in_background(slurm, tmp_path, "train", "--backend", "slurm",
                                     "--nodes", 1, "--max-restarts", 3, BEHAVE,
                                     "--pidfile", pids, "--hang")
    try:
        wait_for(lambda: list(pids.glob("*.pids")), timeout=60, what="the rank to start")
        (job_id,) = submitted_ids(err)
        rank = read_pids(pids, [0])
        if how == "scancel":
            slurm.run("scancel", job_id)
        else:
            res = fluidctl(slurm, tmp_path, "job", "cancel", job_id)
            assert res.returncode == 0, res.stderr
        proc.wait(60)
    finally:
        stop(proc)
    text = err.read_text()
    assert submitted_ids(err) == [job_id], text           # never resubmitted
    assert f"job {job_id} was cancelled" in text and "restarting" not in text, text
    assert proc.returncode != 0, text
    wait_for(lambda: not any(alive(p) for p in rank), timeout=30, what="the rank to end")
    assert "fluidctl" not in slurm.run("squeue", "-h", "-o", "%j").stdout  # nothing queued
    if how != "scancel":
        status = fluidctl(slurm, tmp_path, "job", "status", job_id, "--json")
        assert json.loads(status.stdout)["state"] == "CANCELLED" and status.returncode == 1


def test_27_2_a_failure_still_restarts(slurm, tmp_path):
    """Only cancels stop the restarts: a failing rank is resubmitted as before."""
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1,
                   "--max-restarts", 1, BEHAVE, "--fail-rank", 0, "--code", 4)
    assert res.returncode == 4, res.stderr
    assert len(re.findall(r"submitted Slurm job (\d+)", res.stderr)) == 2, res.stderr


# --- #14: the end of a job is kept, and the exit file ends it -------------------------------
def test_27_14_a_cancelled_job_stays_cancelled_after_slurm_forgets_it(slurm, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    proc, err = follow_in_background(slurm, tmp_path, "train", "--backend", "slurm",
                                     "--nodes", 1, BEHAVE, "--pidfile", pids, "--hang")
    try:
        wait_for(lambda: list(pids.glob("*.pids")), timeout=60, what="the rank to start")
        (job_id,) = submitted_ids(err)
        slurm.run("scancel", job_id)                 # a user's scancel: nothing recorded it
        proc.wait(60)
    finally:
        stop(proc)
    assert proc.returncode != 0 and f"job {job_id} was cancelled" in err.read_text()
    gone = forget(tmp_path, job_id)
    assert not slurm.run("scontrol", "show", "job", gone, check=False).returncode == 0
    status = fluidctl(slurm, tmp_path, "job", "status", gone, "--json")
    row = json.loads(status.stdout)
    assert (row["state"], row["source"]) == ("CANCELLED", "record"), row
    assert status.returncode == 1
    listed = json.loads(fluidctl(slurm, tmp_path, "job", "list", "--json").stdout)
    assert {r["job_id"]: r["state"] for r in listed}[gone] == "CANCELLED"


def test_27_14_a_failed_job_forgotten_by_slurm_exits_non_zero(slurm, tmp_path):
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1, BEHAVE,
                   "--fail-rank", 0, "--code", 6)
    assert res.returncode == 6, res.stderr
    (job_id,) = re.findall(r"submitted Slurm job (\d+)", res.stderr)
    gone = forget(tmp_path, job_id)
    (tmp_path / "mylog" / f"slurm-{job_id}.exitcode").unlink()    # only the record knows
    status = fluidctl(slurm, tmp_path, "job", "status", gone)
    assert status.returncode == 1 and "FAILED, exit code 6" in status.stdout, status.stdout


def test_27_14_the_exit_file_ends_a_job_slurm_keeps_completing(slurm, tmp_path):
    """A slurmd dies mid-job: the job ends and its batch script writes its exit code, but
    Slurm keeps it COMPLETING until it marks the node down; the follower ends at once."""
    go = tmp_path / "go"
    pids = tmp_path / "pids"
    pids.mkdir()
    victim = slurm.nodes[1]
    proc, err = follow_in_background(slurm, tmp_path, "train", "--backend", "slurm",
                                     "--nodes", 2, "--nproc", 1, BEHAVE, "--pidfile", pids,
                                     "--wait-file", go)
    slurmd = slurm.procs[f"slurmd-{victim}"]
    try:
        wait_for(lambda: len(list(pids.glob("*.pids"))) == 2, timeout=60, what="2 ranks")
        (job_id,) = submitted_ids(err)
        slurmd.send_signal(signal.SIGKILL)
        slurmd.wait(30)
        go.touch()
        exit_file = tmp_path / "mylog" / f"slurm-{job_id}.exitcode"
        wait_for(exit_file.exists, timeout=60, what="the batch script's exit file")
        proc.wait(60)
        # the follower is done while Slurm still holds the job for the dead node
        assert squeue_state(slurm, job_id) == "COMPLETING", slurm.logs()
        assert proc.returncode == 0, err.read_text()
        assert f"job {job_id} COMPLETED, exit code 0" in err.read_text()
        status = fluidctl(slurm, tmp_path, "job", "status", job_id, "--json")
        assert (json.loads(status.stdout)["state"], status.returncode) == ("COMPLETED", 0)
    finally:
        stop(proc)
        go.touch()
        if slurmd.poll() is not None:       # the session's cluster gets its node back
            slurm._spawn(f"slurmd-{victim}", ["/usr/sbin/slurmd", "-D", "-N", victim,
                                              "-f", str(slurm.conf)], slurm.env())
        slurm.cancel_all()
        slurm.wait_idle(timeout=120)


# --- #4 (Slurm case): a SIGKILLed launcher inside an allocation leaves no step --------------
def test_27_4_kill_9_of_the_launcher_and_srun_cancels_the_step(slurm, tmp_path):
    alloc = slurm.allocate(2, 1)
    job_id = alloc["SLURM_JOB_ID"]
    pids = tmp_path / "pids"
    pids.mkdir()
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **alloc)
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "train", "--backend", "slurm",
                             BEHAVE, "--pidfile", str(pids), "--hang"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(list(pids.glob("*.pids"))) == 2, timeout=60, what="2 ranks")
        ranks = read_pids(pids, [0, 1])
        assert len(slurm.steps(job_id)) == 1
        # kill -9 of the launcher, and of its srun before srun can act on its parent-death
        # SIGTERM (which it forwards to the step): on a busy cluster it loses that race (the
        # watchdog SIGKILLs it at once); here, both are SIGKILLed together
        sruns = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if p.name() == "srun"]
        assert sruns
        proc.send_signal(signal.SIGKILL)
        for p in sruns:
            p.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_for(lambda: slurm.steps(job_id) == [], timeout=60, what="the step cancelled")
        wait_for(lambda: not any(alive(p) for p in ranks), timeout=30, what="ranks gone")
        assert slurm.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() == "RUNNING"
    finally:
        stop(proc)
