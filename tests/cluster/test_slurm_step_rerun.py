"""Inside a real Slurm allocation (tests/slurm.py): a step that failed on a node runs again
on the same nodes and ledgers nothing: a task's exit code or signal is the job's, not the
node's (docs/blame.md). A ledgered node is left out of a later job in the allocation, saying
that the job runs on fewer nodes than allocated."""
import json
import os
import subprocess
import sys

import pytest

FAIL_FIRST = """
import os, sys
restart = os.environ.get("PADDLE_RESTART_COUNT")
print("ran on", os.environ["SLURMD_NODENAME"], "restart", restart, flush=True)
sys.exit(5 if restart == "0" else 0)
"""
KILL_FIRST = FAIL_FIRST.replace('sys.exit(5 if restart == "0" else 0)',
                                'restart == "0" and os.kill(os.getpid(), 9)')



def fluidctl(slurm, tmp_path, *args, env):
    full = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_40_5_a_failed_task_is_the_jobs_failure_not_its_nodes(slurm, tmp_path, how):
    """A task that exits 5, or is SIGKILLed (a user's kill -9, the job's own OOM), runs again
    on the same node, ledgers nothing, and the next job in the allocation uses every node."""
    alloc = slurm.allocate(2, 1)
    script = tmp_path / "fail_first.py"
    script.write_text(FAIL_FIRST if how == "exit" else KILL_FIRST)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1,
                   "--max-restarts", 1, "--tee", "all", script, env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ran on 127.0.0.2 restart 1" in res.stdout, res.stdout
    assert "bad-node ledger" not in res.stderr, res.stderr
    launch_log = (tmp_path / "mylog" / "launch.log").read_text()
    assert "task 0 on 127.0.0.2 failed" in launch_log and "--exclude" not in launch_log
    assert json.loads(fluidctl(slurm, tmp_path, "cluster", "ledger", "list", "--json",
                               env={}).stdout) == []
    assert slurm.steps(alloc["SLURM_JOB_ID"]) == []

    alloc = slurm.allocate(2, 1)
    (tmp_path / "x.py").write_text("")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--dry-run", "--json",
                   "x.py", env=alloc)
    assert res.returncode == 0, res.stderr
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == ["127.0.0.2", "127.0.0.3"]


def test_40_5_a_ledgered_node_never_shrinks_the_job_silently(slurm, tmp_path):
    """A node in the ledger (Slurm said it failed) is left out of the next job in the same
    allocation with a warning that the job runs on fewer nodes than allocated; --include-bad
    uses it; --nodes 2 is refused in one line."""
    env = {"FLUIDCTL_STATE_DIR": str(tmp_path / "state")}
    subprocess.run([sys.executable, "-c", "from fluidctl.cluster import ledger; "
                    "ledger.record('127.0.0.2', ledger.STEP_FAILED, "
                    "'Slurm reported a node failure there')"], env={**os.environ, **env},
                   check=True, timeout=60)
    alloc = slurm.allocate(2, 1)
    (tmp_path / "x.py").write_text("")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--dry-run", "--json",
                   "x.py", env=alloc)
    assert res.returncode == 0, res.stderr
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == ["127.0.0.3"]
    assert res.stderr.startswith("note: leaving out 1 node(s) in the bad-node ledger: "
                                 "127.0.0.2 (step-failed, Slurm reported a node failure there")
    assert "warning: the job runs on 1 of the allocation's 2 nodes" in res.stderr
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--dry-run",
                   "x.py", env=alloc)
    assert res.returncode == 2 and res.stderr.startswith(
        "error: 1 of 2 node(s) are in the bad-node ledger (127.0.0.2): 1 left, 2 required")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--include-bad",
                   "--dry-run", "--json", "x.py", env=alloc)
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == ["127.0.0.2", "127.0.0.3"]


def test_without_a_node_to_spare_the_step_runs_again_on_the_same_nodes(slurm, tmp_path):
    alloc = slurm.allocate(2, 1)
    script = tmp_path / "fail_first.py"
    script.write_text(FAIL_FIRST)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--max-restarts", 1,
                   "--tee", "all", script, env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.count(f"ran on 127.0.0.{k} restart 1") for k in (2, 3)) == [1, 1]
    assert json.loads(fluidctl(slurm, tmp_path, "cluster", "ledger", "list", "--json",
                               env={}).stdout) == []
