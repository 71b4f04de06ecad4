"""Which GPU each rank gets, however the job was started (issue 11, items 10-13): Paddle's
PADDLE_WORLD_DEVICE_IDS, remote nodes' own CUDA_VISIBLE_DEVICES, --backend mpi, torchrun's
LOCAL_RANK, pserver mode, nvidia-smi's order and MIG. nvidia-smi is faked; CuPy is the double
of tests/cupy_double. The environment's device names alone: tests/unit/test_gpu_device_ids.py."""
import json
import os
import subprocess
import sys

import pytest

import rankspawn
from fluidctl import envs
from fluidctl.node import worker
from fluidctl.node import agent
from fluidctl.planning import devices
from fluidctl.planning import plan as planner

ROOT = rankspawn.ROOT
DOUBLE = os.path.join(ROOT, "tests", "cupy_double")
MIG_SMI = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa0000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  0: (UUID: MIG-11110000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  1: (UUID: MIG-22220000-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb0000-0000-0000-0000-000000000000)
"""


def fake_smi(tmp_path, text=None, count=4):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    text = text or "".join(f"GPU {i}: Tesla V100 (UUID: GPU-{i}aaa)\n" for i in range(count))
    (bindir / "nvidia-smi").write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    (bindir / "nvidia-smi").chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def env_of(**kw):
    base = dict(rank=0, world_size=4, local_rank=1, local_size=2, nnodes=2,
                endpoints=["a:1", "a:2", "b:1", "b:2"], master="a:9")
    base.update(kw)
    return envs.collective_env(**base)


# --- 11: a remote node's own CUDA_VISIBLE_DEVICES ---------------------------------------------
def test_node_agent_reports_the_ids_cuda_visible_devices_leaves(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    probe = agent.probe(0)
    assert probe.gpu_ids == ["2", "3"] and probe.gpus == 2
    node = planner.remote_node("n1", "10.0.0.1", None, None, None, probe.gpu_ids, 0)
    assert node.gpus == ("2", "3")           # was ("0", "1"): rebuilt as range(count)
    node = planner.remote_node("n1", "10.0.0.1", None, None, "1", probe.gpu_ids, 0)
    assert node.gpus == ("2",)


def test_mig_instances_are_the_devices_and_each_rank_sees_its_own(tmp_path):
    path = fake_smi(tmp_path, MIG_SMI)
    found = devices.discover_gpus({"PATH": path})
    assert found == ["MIG-11110000-0000-0000-0000-000000000000",
                     "MIG-22220000-0000-0000-0000-000000000000", "1"]
    # CUDA_VISIBLE_DEVICES may name MIG instances, GPU UUIDs or unique prefixes of them
    assert devices.discover_gpus({"PATH": path, "CUDA_VISIBLE_DEVICES": "MIG-2222,GPU-bbbb"}) \
        == ["MIG-22220000-0000-0000-0000-000000000000", "1"]
    assert devices.discover_gpus({"PATH": path, "CUDA_VISIBLE_DEVICES": "GPU-,1"}) == []
    env = env_of(local_rank=1, gpus_on_node=found[:2], world_device_ids=[found[:2]] * 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-22220000-0000-0000-0000-000000000000"
    assert env["FLAGS_selected_gpus"] == "0" and env["PADDLE_WORLD_DEVICE_IDS"] == "0,0,0,0"


def test_train_on_mig_instances_plans_one_instance_per_rank(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--gpus", "2", "--dry-run",
                          "--json", "tests/scripts/behave.py"], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, PATH=fake_smi(tmp_path, MIG_SMI),
                                             NCCL_MULTI_RANK_GPU_ENABLE="1"),   # siblings
                         timeout=60)
    assert res.returncode == 0, res.stderr
    procs = json.loads(res.stdout)["procs"]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"][:8] for p in procs] == ["MIG-1111", "MIG-2222"]
    assert [p["env"]["FLAGS_selected_gpus"] for p in procs] == ["0", "0"]


# --- 12: mpirun, torchrun and pserver mode select a device --------------------------------------
def test_worker_under_mpirun_takes_the_nodes_gpus_by_local_rank(tmp_path):
    path = fake_smi(tmp_path)
    environ = {"PATH": path, envs.GPUS: "all", envs.OMPI_LOCAL_SIZE: "2"}
    assert worker.node_gpus(environ) == ["0", "1"]
    assert worker.node_gpus(dict(environ, **{envs.GPUS: "1,3"})) == ["1", "3"]
    assert worker.node_gpus({"PATH": path}) == []
    with pytest.raises(Exception, match="2 rank\\(s\\) on this node but 1 GPU"):
        worker.node_gpus(dict(environ, **{envs.GPUS: "1"}))


@pytest.mark.usefixtures("openmpi")
def test_train_backend_mpi_with_gpus_runs_each_rank_on_its_own_gpu(tmp_path):
    env = dict(os.environ, PATH=fake_smi(tmp_path), FLUIDCTL_TIMEOUT="60",
               PYTHONPATH=DOUBLE + os.pathsep + ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--backend", "mpi",
                          "--gpus", "2", "--log-dir", str(tmp_path / "log"), "--tee", "all",
                          "tests/gpu_worker.py", "handshake"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    outs = []
    for r in range(2):
        text = (tmp_path / "log" / f"workerlog.{r}").read_text()
        outs.append(json.loads([l for l in text.splitlines() if l.startswith("RESULT ")][-1][7:]))
    assert [(o["device"], o["current_device"], o["nccl_rank"]) for o in outs] == \
        [("gpu:0", 0, 0), ("gpu:1", 1, 1)]


def test_pserver_trainers_use_their_gpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=DOUBLE + os.pathsep + ROOT, CUDA_VISIBLE_DEVICES="4,7",
               **envs.pserver_env(role=envs.ROLE_TRAINER, index=1, trainers=2,
                                  pserver_endpoints=["127.0.0.1:1"]),
               FLAGS_selected_gpus="1")
    code = ("import cupy, fluidctl.runtime as rt; ctx = rt.init(); "
            "print(ctx.mode, ctx.device, ctx.device_id, cupy.cuda.Device().id)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["pserver", "gpu:1", "1", "1"]




def test_gpus_all_is_one_rank_per_visible_gpu(tmp_path):
    """torchrun's habit `--gpus all`: every GPU nvidia-smi shows, narrowed by
    CUDA_VISIBLE_DEVICES."""
    env = dict(os.environ, PATH=fake_smi(tmp_path, count=4))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for visible, want in [(None, ["0", "1", "2", "3"]), ("1,3", ["1", "3"])]:
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--gpus", "all",
                              "--dry-run", "--json", "tests/scripts/behave.py"], cwd=ROOT,
                             capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        procs = json.loads(res.stdout)["procs"]
        assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in procs] == [",".join(want)] * len(want)
