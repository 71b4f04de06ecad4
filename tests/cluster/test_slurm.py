"""fluidctl under a REAL Slurm (tests/slurm.py: munged, slurmctld, two slurmd on 127.0.0.2 and
127.0.0.3): plain ``srun`` of ``fluidctl worker`` and of runtime scripts, no launcher."""
import json
import sys

import pytest

from fluidctl import envs

from launchutil import ROOT  # noqa: E402
RUNTIME_WORKER = str(ROOT / "tests" / "runtime_worker.py")

SHOW = """
import json, os, sys
import fluidctl.envs as envs
d = envs.read()
print("CONTRACT " + json.dumps({"rank": d.rank, "size": d.world_size, "local": d.local_rank,
      "local_size": d.local_size, "nnodes": d.nnodes, "endpoints": d.trainer_endpoints,
      "current": d.current_endpoint, "master": d.master, "mode": d.mode,
      "node": os.environ.get("SLURMD_NODENAME"),
      "paddle": {k: v for k, v in os.environ.items() if k.startswith("PADDLE_")},
      "torch": [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                            "MASTER_PORT")]}), flush=True)
"""


def contracts(stdout: str):
    found = [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
             if line.startswith("CONTRACT ")]
    return sorted(found, key=lambda c: c["rank"])


def results(stdout: str):
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith("RESULT ")]


def test_plain_srun_of_fluidctl_worker_gets_the_whole_contract(slurm, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    res = slurm.run("srun", "-N2", "--ntasks-per-node=2", sys.executable, "-m", "fluidctl",
                    "worker", str(script), cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    got = contracts(res.stdout)
    assert [c["rank"] for c in got] == [0, 1, 2, 3]
    endpoints = got[0]["endpoints"]
    assert [e.split(":")[0] for e in endpoints] == ["127.0.0.2", "127.0.0.2", "127.0.0.3",
                                                    "127.0.0.3"]
    for c in got:
        assert c["node"] == ("127.0.0.2" if c["rank"] < 2 else "127.0.0.3")
        assert (c["size"], c["local"], c["local_size"], c["nnodes"]) == (4, c["rank"] % 2, 2, 2)
        assert c["current"] == endpoints[c["rank"]] and c["endpoints"] == endpoints
        assert c["master"].startswith("127.0.0.2:") and c["mode"] == "collective"
        assert c["paddle"]["PADDLE_TRAINER_ID"] == str(c["rank"])
        assert c["paddle"]["PADDLE_TRAINER_ENDPOINTS"] == ",".join(endpoints)
        assert c["torch"] == [str(c["rank"]), "4", str(c["rank"] % 2), "127.0.0.2",
                              c["master"].split(":")[1]]


TRAIN = """
import json, sys
import numpy as np
import fluidctl.runtime as rt
ctx = rt.init(timeout=60)
total = ctx.allreduce(np.full(3, ctx.rank + 1.0), "sum")
print("RESULT " + json.dumps({"rank": ctx.rank, "sum": total.tolist()}), flush=True)
"""


def no_token_env(slurm, tmp_path):
    """The cluster's environment with no job token anywhere, and the user secret under
    tmp_path (FLUIDCTL_STATE_DIR) rather than the real home."""
    env = slurm.env()
    env.pop("FLUIDCTL_JOB_TOKEN", None)
    env["FLUIDCTL_STATE_DIR"] = str(tmp_path / "state")
    return env


def test_plain_srun_runtime_allreduce_across_two_nodes(slurm, tmp_path):
    """No fluidctl launcher and no worker: fluidctl.runtime.init() maps SLURM_* itself; two
    nodes of two ranks each reduce through shared memory and the TCP ring (hierarchical). No
    token is exported (issue 25.2): every task derives the step's token from the user secret."""
    res = slurm.run("srun", "-N2", "--ntasks-per-node=2", sys.executable, RUNTIME_WORKER, "ops",
                    cwd=tmp_path, check=False, timeout=120, env=no_token_env(slurm, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    got = results(res.stdout)
    assert len(got) == 4
    for r in got:
        assert r["transport"] == "hierarchical", r
        assert all(v for k, v in r.items() if k not in ("transport", "shm_direct", "shm_native")), r


@pytest.mark.parametrize("worker", [False, True], ids=["python", "fluidctl-worker"])
def test_plain_srun_authenticates_without_a_token(slurm, tmp_path, worker):
    """Issue 25.2: `srun -N2 -n2 python train.py` (and `srun ... fluidctl worker train.py`)
    with rt.init() and an allreduce, no FLUIDCTL_JOB_TOKEN: the user secret is made once,
    mode 0600, and both ranks derive the same token from it."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    entry = [sys.executable, "-m", "fluidctl", "worker"] if worker else [sys.executable]
    res = slurm.run("srun", "-N2", "-n2", *entry, str(script), cwd=tmp_path, check=False,
                    timeout=120, env=no_token_env(slurm, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted((r["rank"], r["sum"]) for r in results(res.stdout)) == [
        (0, [3.0] * 3), (1, [3.0] * 3)]
    secret = tmp_path / "state" / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in secret.parent.iterdir()] == ["secret"]     # no temporary left


def test_plain_srun_without_a_usable_secret_is_one_line(slurm, tmp_path):
    """A user secret others can read is refused: one line per rank, exit 2, no traceback."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    secret = tmp_path / "state" / "secret"
    secret.parent.mkdir()
    secret.write_text("x" * 64)
    secret.chmod(0o644)
    res = slurm.run("srun", "-N2", "-n2", sys.executable, str(script), cwd=tmp_path,
                    check=False, timeout=120, env=no_token_env(slurm, tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 2, res.stderr
    assert f"{secret} is readable by others (mode 644) (chmod 600 {secret}" in lines[0]


def test_busy_master_port_is_named_by_rank_0(slurm, tmp_path):
    """The derived master port is checked: a busy one ends the step with a one-line error."""
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = slurm.run("srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        f"--export=ALL,{envs.TORCH_MASTER_PORT}={port}", sys.executable, "-m",
                        "fluidctl", "worker", "true", cwd=tmp_path, check=False)
    # srun exits with the highest code of any task (143 for one it terminated); its own report
    # names the task that failed first
    assert res.returncode != 0 and "task 0: Exited with exit code 2" in res.stderr, res.stderr
    assert f"error: master port {port} on 127.0.0.2 (127.0.0.2) is not usable" in res.stderr
