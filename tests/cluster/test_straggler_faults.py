"""The straggler report (fluidctl/diagnostics/stragglers.py) against real faults: a node's CPU
throttled by its cgroup, a node's link capped by tc tbf (namespace nodes, tests/netns.py),
a data loader that sleeps in one rank (local backend; --backend mpi, its pages published
with pwrite as on NFS; a job submitted to the real Slurm of tests/slurm.py, whose ranks'
pages its own launcher reads in the shared LOG_DIR), and a healthy job beside CPU hogs that
must not be reported. Each job runs tests/scripts/straggle.py until the test drops its stop
file; the fault comes after step WARM and must be named within 20 collectives. The same loop
as unmodified torch and Paddle scripts (straggle_torch.py, straggle_paddle.py: the step marks
of fluidctl/diagnostics/stepmarks.py) must be named within 20 steps, and not before."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fluidctl.paths import DiagDir
from launchutil import default_sigint, fluidctl, start_fluidctl, torch_exit_ok, wait_for

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
STRAGGLE = str(SCRIPTS / "straggle.py")
WARM = 15               # steps before the fault
WITHIN = 20             # collectives from the fault to the report (the goal)


def last_step(log) -> int:
    log = log() if callable(log) else log
    steps = re.findall(r"^step (\d+)$", log.read_text() if log and log.exists() else "", re.M)
    return int(steps[-1]) if steps else -1


def run_with_fault(tmp_path, args, rank0_log, fault, script=(), start=None, report=None,
                   program=STRAGGLE):
    """Start the job (``start(*argv)``, default fluidctl here), apply ``fault()`` after step
    WARM, wait for the report (``report()``, default mylog/stragglers.json); returns (the
    report, with the step rank 0 had logged when it came as "step_seen", the step the fault
    came at, the job's output)."""
    argv = ("train", *args, program, "--stop-file", tmp_path / "STOP", *script)
    proc = start(*argv) if start else start_fluidctl(*argv, cwd=tmp_path)
    report = report or (lambda: tmp_path / "mylog" / "stragglers.json")
    seen = -1
    try:
        wait_for(lambda: last_step(rank0_log) >= WARM or proc.poll() is not None, 60,
                 f"step {WARM}")
        assert proc.poll() is None, proc.communicate()
        at = last_step(rank0_log)
        fault()
        wait_for(lambda: report().exists() or proc.poll() is not None, 60, "a straggler report")
        seen = last_step(rank0_log)
    finally:
        (tmp_path / "STOP").write_text("")
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
    assert report().exists(), out + err
    assert torch_exit_ok(proc.returncode, out + err), out + err
    return {**json.loads(report().read_text()), "step_seen": seen}, at, out + err


def netns_args(nodes):
    return ["--hostfile", nodes.hostfile(), "--ssh-config", nodes.config]


def test_throttled_cpu_is_slow_compute_on_that_node(tmp_path, netns_nodes):
    nodes = netns_nodes(3)
    found, at, out = run_with_fault(
        tmp_path, netns_args(nodes), tmp_path / "mylog" / "node1" / "workerlog.0",
        lambda: nodes.throttle_cpu("node2", 0.05))
    assert (found["kind"], found["ranks"], found["hosts"]) == ("compute", [1], {"1": "node2"}), out
    assert found["at_collective"] - at <= WITHIN, (at, found)
    assert found["line"] in out and out.count("straggler:") == 1, out


def test_capped_link_is_a_slow_link_at_that_node(tmp_path, netns_nodes):
    nodes = netns_nodes(3)
    found, at, out = run_with_fault(
        tmp_path, netns_args(nodes), tmp_path / "mylog" / "node1" / "workerlog.0",
        lambda: nodes.cap_link("node2", "20mbit"), script=["--floats", 64 << 10])
    assert found["kind"] == "link", out
    assert sorted(map(tuple, found["links"])) == [(0, 1), (1, 2)]   # into and out of node2
    assert "slow link at node2" in found["line"] and found["line"] in out
    assert found["at_collective"] - at <= WITHIN, (at, found)


def test_sleeping_data_loader_is_slow_data(tmp_path):
    found, at, out = run_with_fault(
        tmp_path, ["--nproc", 3], tmp_path / "mylog" / "workerlog.0", lambda: None,
        script=["--slow-data", f"2:100:{WARM + 2}", "--work", 5])
    assert (found["kind"], found["ranks"]) == ("data", [2]), out
    assert found["at_collective"] - (WARM + 2) <= WITHIN, found
    assert "rank 2 (127.0.0.1) is slow data" in out


@pytest.mark.parametrize("program", [STRAGGLE, str(SCRIPTS / "straggle_torch.py")],
                         ids=["runtime", "torch"])
def test_sleeping_data_loader_under_mpirun_with_published_pages(tmp_path, openmpi, program):
    """--backend mpi: the ranks' pages are in the diagnostics dir in LOG_DIR, written with
    pwrite every 0.5 s as on NFS (FLUIDCTL_DIAG_WRITE), and the launcher names rank 2 and
    the node its worker registered; for the unmodified torch script too, which ``fluidctl
    worker`` runs in its own process (the step hooks installed there, not by sitecustomize)."""
    proc = lambda *argv: start_fluidctl(*argv, cwd=tmp_path,     # noqa: E731
                                        env={"FLUIDCTL_DIAG_WRITE": "pwrite"})
    found, at, out = run_with_fault(
        tmp_path, ["--backend", "mpi", "--nproc", 3], tmp_path / "mylog" / "workerlog.0",
        lambda: None, script=["--slow-data", f"2:100:{WARM + 2}", "--work", 5], start=proc,
        program=program)
    node = DiagDir.this_node(os.environ)
    assert (found["kind"], found["ranks"], found["hosts"]) == ("data", [2], {"2": node}), out
    if program != STRAGGLE:
        assert found["evidence"] == "from torch's collective records", found
    late = found["at_collective"] if program == STRAGGLE else found["step_seen"]
    assert late - (WARM + 2) <= WITHIN, found
    assert f"fluidctl: straggler: rank 2 ({node}) is slow data" in out
    assert found["line"] in (tmp_path / "mylog" / "stragglers.log").read_text()


@pytest.mark.parametrize("program", [STRAGGLE, str(SCRIPTS / "straggle_torch.py")],
                         ids=["runtime", "torch"])
def test_sleeping_data_loader_in_a_submitted_slurm_job(tmp_path, slurm, program):
    """sbatch + follow: the batch job's own fluidctl names rank 2 on node 127.0.0.3 in
    LOG_DIR/slurm-JOBID/stragglers.json, and the follower says the same line; for the
    unmodified torch script too (its step marks: ``fluidctl worker`` puts the hooks on the
    PYTHONPATH of the program it execs)."""
    job = lambda: next((tmp_path / "mylog").glob("slurm-*/"), None)     # noqa: E731

    def start(*argv):
        return subprocess.Popen(
            [sys.executable, "-m", "fluidctl", *map(str, argv)], cwd=tmp_path,
            env=slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state")), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    found, at, out = run_with_fault(
        tmp_path, ["--backend", "slurm", "--nodes", 2, "--nproc", 2, "--partition",
                   slurm.partition, "--time", "5:00"],
        lambda: job() and job() / "workerlog.0", lambda: None,
        script=["--slow-data", f"2:100:{WARM + 2}", "--work", 5], start=start,
        report=lambda: (job() or tmp_path) / "stragglers.json", program=program)
    assert (found["kind"], found["ranks"], found["hosts"]) == \
        ("data", [2], {"2": "127.0.0.3"}), out
    if program != STRAGGLE:
        assert found["evidence"] == "from torch's collective records", found
    late = found["at_collective"] if program == STRAGGLE else found["step_seen"]
    assert late - (WARM + 2) <= WITHIN, found       # torch: two collectives a step
    assert found["line"].startswith("fluidctl: straggler: rank 2 (127.0.0.3) is slow data")
    assert found["line"] in (job() / "stragglers.log").read_text()
    assert found["line"] in out                     # relayed by the follower


HOG = "import os\nwhile not os.path.exists(%r): pass\n"


def test_healthy_job_beside_cpu_hogs_is_not_reported(tmp_path, netns_nodes):
    nodes = netns_nodes(3)
    stop = tmp_path / "hogs.stop"
    hogs = [subprocess.Popen([sys.executable, "-c", HOG % str(stop)]) for _ in range(2)]
    try:
        res = fluidctl("train", *netns_args(nodes), STRAGGLE, "--steps", 60,
                       cwd=tmp_path, timeout=120)
    finally:
        stop.write_text("")
        for hog in hogs:
            hog.wait(10)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "step 59" in res.stdout
    assert "straggler" not in res.stdout + res.stderr
    assert not (tmp_path / "mylog" / "stragglers.json").exists()


def test_torch_script_sleeping_data_loader_is_slow_data_and_nothing_before(tmp_path):
    found, at, out = run_with_fault(
        tmp_path, ["--nproc", 3], tmp_path / "mylog" / "workerlog.0", lambda: None,
        script=["--slow-data", f"2:150:{WARM + 2}", "--work", 5],
        program=SCRIPTS / "straggle_torch.py")
    assert (found["kind"], found["ranks"]) == ("data", [2]), out
    assert found["evidence"] == "from torch's collective records"
    assert found["step_seen"] - (WARM + 2) <= WITHIN, found
    assert out.count("straggler:") == 1 and "rank 2 (127.0.0.1) is slow data" in out, out


def test_paddle_script_rank_computing_more_is_slow_compute(tmp_path):
    found, at, out = run_with_fault(
        tmp_path, ["--nproc", 3], tmp_path / "mylog" / "workerlog.0", lambda: None,
        script=["--slow-compute", f"1:150:{WARM + 2}", "--work", 5],
        program=SCRIPTS / "straggle_paddle.py")
    assert (found["kind"], found["ranks"]) == ("compute", [1]), out
    assert found["evidence"] == "from step markers (backward calls)"
    assert found["step_seen"] - (WARM + 2) <= WITHIN, found
    assert out.count("straggler:") == 1 and "rank 1 (127.0.0.1) is slow compute" in out, out
