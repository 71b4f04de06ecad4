"""Inside a real Slurm allocation (tests/slurm.py): a step that failed on a node runs again
on the allocation's other nodes (srun --exclude) when --nodes leaves one to spare, and the
node goes to the bad-node ledger (reason step-failed)."""
import json
import subprocess
import sys

FAIL_FIRST = """
import os, sys
restart = os.environ.get("PADDLE_RESTART_COUNT")
print("ran on", os.environ["SLURMD_NODENAME"], "restart", restart, flush=True)
sys.exit(5 if restart == "0" else 0)
"""


def fluidctl(slurm, tmp_path, *args, env):
    full = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_failed_step_runs_again_without_its_node_and_the_node_is_ledgered(slurm, tmp_path):
    alloc = slurm.allocate(2, 1)
    script = tmp_path / "fail_first.py"
    script.write_text(FAIL_FIRST)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1,
                   "--max-restarts", 1, "--tee", "all", script, env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ran on 127.0.0.3 restart 1" in res.stdout, res.stdout
    assert ("fluidctl: 127.0.0.2 failed (task 0): running the step again on 127.0.0.3 "
            "(srun --exclude=127.0.0.2); 127.0.0.2 is in the bad-node ledger") in res.stderr
    launch_log = (tmp_path / "mylog" / "launch.log").read_text()
    assert "--nodelist=127.0.0.3 --exclude=127.0.0.2" in launch_log
    [entry] = json.loads(fluidctl(slurm, tmp_path, "cluster", "ledger", "list", "--json",
                                  env={}).stdout)
    assert (entry["host"], entry["why"], entry["job"]) == (
        "127.0.0.2", "step-failed", alloc["SLURM_JOB_ID"])
    assert entry["detail"] == "task 0 of a step failed there (exit code 5)"
    assert slurm.steps(alloc["SLURM_JOB_ID"]) == []

    # the next job in an allocation of both nodes leaves the ledgered one out, unless told
    alloc = slurm.allocate(2, 1)
    (tmp_path / "x.py").write_text("")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--dry-run", "--json",
                   "x.py", env=alloc)
    assert res.returncode == 0, res.stderr
    assert [n["name"] for n in json.loads(res.stdout)["nodes"]] == ["127.0.0.3"]
    assert res.stderr.startswith("note: leaving out 1 node(s) in the bad-node ledger: "
                                 "127.0.0.2 (step-failed, task 0 of a step failed there")
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
    assert "the allocation has no node to spare for the 2 the step needs: running again on " \
           "the same nodes" in res.stderr, res.stderr
    hosts = [e["host"] for e in json.loads(fluidctl(slurm, tmp_path, "cluster", "ledger",
                                                    "list", "--json", env={}).stdout)]
    assert len(hosts) == 1 and hosts[0] in ("127.0.0.2", "127.0.0.3")
