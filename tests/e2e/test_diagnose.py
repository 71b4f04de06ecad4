"""Hang autopsy, fluidctl dump, failure triage and the echo options on real jobs on this
machine (fluidctl train, real processes, the real runtime; and under mpirun); over ssh nodes:
tests/cluster/test_diagnose_cluster.py."""
import json
import os
import re
import signal
import time

import pytest

from launchutil import fluidctl, start_fluidctl, wait_for
from cgroups import make_memory_cgroup
from troubleutil import IDLE, LOADER, RAISE, STUCK, TROUBLE, hang_dir

@pytest.mark.parametrize("pyspy", [True, False], ids=["py-spy", "faulthandler"])
def test_hang_is_diagnosed_with_both_stacks_and_exit_124(tmp_path, pyspy):
    from fluidctl.diagnostics import stacks
    if pyspy and not stacks.pyspy_path():
        pytest.skip("py-spy not installed (pip install 'fluidctl[debug]')")
    env = {} if pyspy else {"FLUIDCTL_PYSPY": ""}
    proc = fluidctl("train", "--nproc", 3, "--hang-timeout", 2, "--log-dir", tmp_path / "log",
                    TROUBLE, "stuck", cwd=tmp_path, env=env)
    assert proc.returncode == 124, proc.stderr
    err = proc.stderr
    assert re.search(r"fluidctl: the job hung: slow data: rank 1 on 127\.0\.0\.1 is in its data "
                     rf"loader \(load_batch at trouble\.py:{LOADER}, \d% CPU\); ranks 0,2 wait "
                     rf"in allreduce #2 \(trouble\.py:{STUCK}\)", err), err
    assert "  no rank wrote to its log and no collective completed for 2s" in err
    assert f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}" in err, err
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in err, err
    where = hang_dir(tmp_path / "log")
    assert f"every rank's full stack: {where}/" in err
    method = "py-spy" if pyspy else "faulthandler"
    for rank in range(3):
        text = (where / f"rank-{rank}.txt").read_text()
        assert text.startswith(f"# rank {rank} on 127.0.0.1, taken with {method}")
    assert "load_batch" in (where / "rank-1.txt").read_text()
    if not pyspy:
        assert "note: py-spy is off (FLUIDCTL_PYSPY is empty); using faulthandler instead" in err
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["exit_code"] == 124 and report["first_failure"] is None
    assert report["hang"]["summary"][0] == f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}"
    assert report["hang"]["class"] == "slow data" and report["hang"]["ranks"] == [1]
    assert [e["collectives_done"] for e in report["hang"]["evidence"]] == [1, 1, 1]
    assert [p["state"].startswith("still running; stopped by fluidctl")
            for p in report["processes"]] == [True] * 3
    assert not (tmp_path / "log" / "job.json").exists()
    # the verdict is one event (fluidctl/telemetry): failure.json's hang, one launch.log line
    from fluidctl.telemetry import from_record, read_events
    [hang] = [from_record(r) for r in read_events(tmp_path / "log" / "events.jsonl")]
    assert hang.failure_record() == report["hang"]
    assert (tmp_path / "log" / "launch.log").read_text().count(hang.log_line()) == 1


def test_hang_timeout_from_the_environment_and_bad_values(tmp_path):
    proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log", TROUBLE, "stuck",
                    cwd=tmp_path, env={"FLUIDCTL_HANG_TIMEOUT": "2"})
    assert proc.returncode == 124 and "the job hung" in proc.stderr
    bad = fluidctl("train", "--hang-timeout", 0, TROUBLE, "stuck", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("error: --hang-timeout 0 is not positive (give seconds, e.g. "
                                  "--hang-timeout 600, or leave it out)")
    refused = fluidctl("train", "--backend", "mpi", "--tee-ranks", "0", TROUBLE, "stuck",
                       cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "--tee-ranks needs fluidctl's own supervision of every rank" in refused.stderr


def test_collectives_completing_in_silence_are_not_a_hang(tmp_path):
    # 4 s of allreduces and not a line of output: the runtime's progress counter keeps the
    # 1 s watchdog quiet
    proc = fluidctl("train", "--nproc", 2, "--hang-timeout", 1, "--log-dir", tmp_path / "log",
                    TROUBLE, "busy", 4, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / "log").glob("hang-*"))
    assert not (tmp_path / "log" / "failure.json").exists()


def test_fluidctl_dump_on_a_running_job(tmp_path):
    log = tmp_path / "log"
    job = start_fluidctl("train", "--nproc", 2, "--log-dir", log, TROUBLE, "wait",
                         cwd=tmp_path)
    try:
        wait_for(lambda: all("ready" in (log / f"workerlog.{r}").read_text()
                             for r in range(2) if (log / f"workerlog.{r}").exists())
                 and (log / "job.json").exists(), 60, "both ranks ready")
        out = fluidctl("dump", "--log-dir", log, cwd=tmp_path, timeout=90)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("fluidctl dump: the running job's stacks\n")
        assert f"ranks 0,1 are in idle at trouble.py:{IDLE}" in out.stdout, out.stdout
        (where,) = list(log.glob("dump-*"))
        assert (where / "rank-0.txt").exists() and (where / "rank-1.txt").exists()
        assert job.poll() is None                 # the job goes on
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    assert job.returncode == 143
    gone = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert gone.returncode == 2
    assert gone.stderr.startswith(f"error: no running job in {log}")


def test_fluidctl_dump_of_a_job_launched_on_another_machine_is_refused(tmp_path):
    """LOG_DIR may be shared (Slurm, NFS): a launcher pid from job.json written on another host
    must not be signalled here, where it is some other process (here: pytest itself)."""
    log = tmp_path / "log"
    log.mkdir()
    (log / "job.json").write_text(json.dumps({"pid": os.getpid(), "host": "gpu042",
                                              "started": time.time()}))
    out = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (f"error: the job in {log} has its launcher on gpu042, not on this "
                          f"machine (run it there: ssh gpu042 fluidctl dump --log-dir {log})\n")
    # a Slurm job's launcher is reached through Slurm (compute nodes often refuse plain ssh)
    (log / "job.json").write_text(json.dumps({"pid": os.getpid(), "host": "gpu042",
                                              "slurm_job_id": "5150", "started": time.time()}))
    out = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.endswith(f"(run it there: srun --jobid 5150 --overlap -w gpu042 fluidctl "
                               f"dump --log-dir {log})\n"), out.stderr


def test_failure_report_names_the_exception_and_every_other_rank(tmp_path):
    proc = fluidctl("train", "--nproc", 3, "--log-dir", tmp_path / "log", "--grace-period", 1,
                    TROUBLE, "raise", cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert "fluidctl: trainer 1 failed on 127.0.0.1: exit code 1" in err
    assert "s after start)" in err
    assert f"why: ValueError: shard 1 has 0 records (at trouble.py:{RAISE})" in err, err
    assert "trainer 0 on 127.0.0.1: still running; stopped by fluidctl" in err
    assert "trainer 2 on 127.0.0.1: still running; stopped by fluidctl" in err
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    first = report["first_failure"]
    assert (first["label"], first["kind"], first["exit_code"]) == ("trainer 1", "exception", 1)
    assert first["explanation"] == f"ValueError: shard 1 has 0 records (at trouble.py:{RAISE})"
    assert first["seconds_since_start"] > 0
    assert first["log_tail"][-1] == "ValueError: shard 1 has 0 records"
    assert sorted(p["label"] for p in report["processes"]) == ["trainer 0", "trainer 1",
                                                               "trainer 2"]


def test_segfault_is_named(tmp_path):
    proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log", "--grace-period", 1,
                    TROUBLE, "segv", cwd=tmp_path)
    assert proc.returncode == 139
    assert "failed on 127.0.0.1: signal SIGSEGV" in proc.stderr
    assert "why: crashed (SIGSEGV: segmentation fault in native code" in proc.stderr


def test_oom_kill_in_a_memory_limited_cgroup(tmp_path):
    cgroup = make_memory_cgroup(128 << 20)
    if cgroup is None:
        pytest.skip("cannot create a memory-limited cgroup here")
    try:
        proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log",
                        "--grace-period", 1, TROUBLE, "oom", cgroup, cwd=tmp_path)
    finally:
        os.rmdir(cgroup)
    assert proc.returncode == 137, proc.stderr
    assert "trainer 1 failed on 127.0.0.1: signal SIGKILL" in proc.stderr
    assert "why: killed for memory: it used" in proc.stderr, proc.stderr
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["first_failure"]["kind"] == "oom"
    assert report["first_failure"]["signal"] == "SIGKILL"


def test_tee_ranks_and_progress_bars_collapsed_in_the_echo_only(tmp_path):
    proc = fluidctl("train", "--nproc", 3, "--tee-ranks", "0,2", "--log-dir", tmp_path / "log",
                    TROUBLE, "progress", cwd=tmp_path, check=0)
    lines = proc.stdout.splitlines()
    for rank in (0, 2):
        mine = [l for l in lines if l.startswith(f"[trainer {rank}] ")]
        assert mine == [f"[trainer {rank}] rank {rank} ready", f"[trainer {rank}] step 5/5",
                        f"[trainer {rank}] done"], lines
    assert not any(l.startswith("[trainer 1]") for l in lines)
    assert (tmp_path / "log" / "workerlog.1").read_bytes().count(b"\rstep") == 5  # file: all
    bad = fluidctl("train", "--nproc", 2, "--tee-ranks", "0,5", TROUBLE, "progress",
                   cwd=tmp_path)
    assert bad.returncode == 2
    assert "error: --tee-ranks names rank 5, but the job has 2 trainer(s)" in bad.stderr


# --- under mpirun: the ranks are mpirun's, their stacks are taken on their nodes -------------

@pytest.mark.usefixtures("openmpi")
def test_hang_under_mpirun_on_one_node(tmp_path):
    """--backend mpi: each rank's worker registers in the diagnostics dir in LOG_DIR, and a
    second mpirun (one stack taker per node) takes the stacks."""
    proc = fluidctl("train", "--backend", "mpi", "--nproc", 3, "--hang-timeout", 4,
                    "--log-dir", tmp_path / "log", TROUBLE, "stuck", cwd=tmp_path, timeout=180)
    assert proc.returncode == 124, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}" in proc.stderr, proc.stderr
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in proc.stderr
    assert ("fluidctl: the job hung: slow data: rank 1 on ") in proc.stderr
    assert f"ranks 0,2 wait in allreduce #2 (trouble.py:{STUCK})" in proc.stderr
    where = hang_dir(tmp_path / "log")
    assert sorted(p.name for p in where.iterdir()) == [
        "rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    assert json.loads((tmp_path / "log" / "failure.json").read_text())["hang"]["dir"] == \
        str(where)
    assert not list((tmp_path / "log").glob(".fluidctl_diag.*"))


@pytest.mark.usefixtures("openmpi")
def test_a_crash_under_mpirun_is_reported_as_that_rank(tmp_path):
    """mpirun exits 1 whatever happened; the report names the rank mpirun saw fail first,
    with its signal, node and pid, and triage explains the crash from its own log."""
    proc = fluidctl("train", "--backend", "mpi", "--nproc", 3, "--log-dir", tmp_path / "log",
                    TROUBLE, "segv", cwd=tmp_path, timeout=180)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    # the pid is there when prterun prints its "noticed that process rank 1 with PID ..."
    # wording; which of its two wordings it prints is a race inside prterun (~1 run in 5 here)
    assert re.search(r"fluidctl: trainer 1 failed on \S+: signal SIGSEGV \((pid \d+|at )",
                     proc.stderr), proc.stderr
    assert "why: crashed (SIGSEGV" in proc.stderr
    assert f"log: {tmp_path / 'log' / 'workerlog.1'}" in proc.stderr
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["first_failure"]["label"] == "trainer 1"
    assert report["first_failure"]["signal"] == "SIGSEGV"
