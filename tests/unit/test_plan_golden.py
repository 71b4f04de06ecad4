"""plan() and every rank's environment against golden JSON records (submitit's style): the
exact ``--dry-run --json`` output for a local, a multi-node, a pserver and an mpi job.

A change to the contract shows up here as a diff of a readable file. After a deliberate change,
rewrite the records with ``FLUIDCTL_REGOLD=1 python -m pytest tests/unit/test_plan_golden.py`` and
review the diff like code.
"""
import json
import os
from pathlib import Path

import pytest

from fluidctl import envs
from fluidctl.planning import plan as planner
from fluidctl.planning.config import LaunchConfig
from fluidctl.planning.hosts import parse_hostfile_text
from fluidctl.planning.plan import LaunchCommand

from launchutil import ROOT  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
PY = "/opt/py/bin/python3"


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch):
    """The contract leaves CPU_NUM/OMP_NUM_THREADS alone when this environment sets them."""
    for name in (envs.CPU_NUM, envs.OMP_NUM_THREADS, envs.CUDA_DEVICE_ORDER):
        monkeypatch.delenv(name, raising=False)


def config(**kw):
    base = dict(script="train.py", script_args=("--epochs", "3"), token="t0ken", python=PY,
                user_env={"A": "1"}, log_dir="mylog")
    base.update(kw)
    return LaunchConfig(**base)


def job(cfg, nodes, **kw):
    spec = cfg.job(nodes, **kw)
    spec.cores = 8
    return spec


def check(name, plan):
    got = json.dumps(plan.to_json(), indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"{name}.json"
    if os.environ.get("FLUIDCTL_REGOLD"):
        path.write_text(got)
    assert got == path.read_text(), f"plan differs from {path}"


def test_local_collective_two_gpus():
    cfg = config(gpus="0,1")
    node = planner.local_node(cfg.nproc, cfg.gpus, cfg.mode, cfg.pservers,
                              cfg.pserver_endpoints, ["0", "1", "2"])
    check("local_collective", planner.make_plan(job(cfg, [node]), {0: [7000, 7001, 7002]}))


def test_multi_node_uneven_slots():
    cfg = config(backend="ssh", hosts=tuple(parse_hostfile_text("n1 slots=1\nn2 slots=2\n")))
    nodes = [planner.remote_node("n1", "10.0.0.1", 1, None, None, [], 0),
             planner.remote_node("n2", "10.0.0.2", 2, None, None, [], 0)]
    spec = job(cfg, nodes, multi_node_logs=True)
    ports = {0: [7000, 7001], 1: [7100, 7101]}
    commands = [LaunchCommand("n1", [PY, "-m", "fluidctl.node.agent", "--ports", "2"]),
                LaunchCommand("n2", [PY, "-m", "fluidctl.node.agent", "--ports", "3"])]
    check("multinode_collective", planner.make_plan(spec, ports, backend="ssh", commands=commands))


def test_pserver_mode_two_nodes_pservers_round_robin():
    cfg = config(backend="ssh", mode="pserver", pservers=3,
                 pserver_args=("--checkpoint-dir", "/ckpt"))
    counts = planner.pserver_counts(cfg.mode, cfg.pserver_endpoints, cfg.pservers,
                                    cfg.pserver_hosts, ["n1", "n2"])
    assert counts == [2, 1]
    nodes = [planner.remote_node(n, a, 1, None, None, [], k)
             for n, a, k in (("n1", "10.0.0.1", 2), ("n2", "10.0.0.2", 1))]
    ports = {0: [7000, 7001, 7002, 7003], 1: [7100, 7101]}
    check("pserver_two_nodes", planner.make_plan(job(cfg, nodes, multi_node_logs=True), ports,
                                                 backend="ssh"))


def test_mpi_over_two_hosts():
    hosts = tuple(parse_hostfile_text("n1 slots=2\nn2\n"))
    cfg = config(backend="mpi", hosts=hosts, nproc=3)
    nodes = planner.mpi_nodes(cfg.hosts, cfg.nproc)
    assert [n.nproc for n in nodes] == [2, 3]
    argv = [PY, "-m", "fluidctl", "worker", "train.py", "--epochs", "3"]
    plan = planner.plan_mpi(job(cfg, nodes), argv, commands=[LaunchCommand("127.0.0.1", [
        "mpirun", "-np", "5", "--hostfile", "mylog/mpi.hostfile", *argv])])
    data = plan.to_json()
    for proc in data["procs"]:                   # the log dir is made absolute for the ranks
        assert proc["env"][envs.LOG_DIR] == str(Path("mylog").resolve())
    for proc in plan.procs:
        proc.env[envs.LOG_DIR] = "<abs>/mylog"
    check("mpi_two_hosts", plan)


def test_every_backend_prints_the_same_keys():
    keys = {tuple(json.loads((GOLDEN / f).read_text())) for f in os.listdir(GOLDEN)}
    assert len(keys) == 1, keys


def test_a_launch_command_s_cwd_is_in_the_json_only_when_the_plan_sets_it():
    """The ssh backend sets each node agent's directory (--remote-dir, '{host}' expanded);
    the other backends' records are unchanged."""
    from fluidctl.backends.ssh.agent import node_dir
    assert node_dir("/scratch/{host}/job", "n2") == "/scratch/n2/job"
    assert LaunchCommand("n1", ["a"]).to_json() == {"host": "n1", "argv": ["a"]}
    assert LaunchCommand("n1", ["a"], cwd="/w/n1").to_json() == {
        "host": "n1", "argv": ["a"], "cwd": "/w/n1"}
