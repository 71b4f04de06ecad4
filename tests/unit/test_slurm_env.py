"""SLURM_* -> the PADDLE_*/torch contract (fluidctl.envs.from_slurm), in process: node lists,
task layouts, derived ports, GPU binding, and what must be refused."""
import pytest

from fluidctl import envs
from fluidctl.errors import UsageError


def task(rank, local, node, *, nodelist="gpu[001-002]", tpn="2(x2)", ntasks=4, job="4242",
         **extra):
    """The variables srun gives one task (as measured under Slurm 22.05)."""
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
           "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node), "SLURM_NTASKS": str(ntasks),
           "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_JOB_NODELIST": nodelist,
           "SLURM_STEP_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": "2",
           "SLURM_STEP_TASKS_PER_NODE": tpn, "SLURM_TASKS_PER_NODE": tpn,
           "SLURM_CPUS_ON_NODE": "8", "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9"}
    env.update(extra)
    return env


def test_nodelists():
    assert envs.expand_nodelist("gpu[001-004,7]") == ["gpu001", "gpu002", "gpu003", "gpu004",
                                                      "gpu7"]
    assert envs.expand_nodelist("a[1-2],b3,c[08-09]-ib") == ["a1", "a2", "b3", "c08-ib", "c09-ib"]
    assert envs.expand_nodelist("127.0.0.[2-3]") == ["127.0.0.2", "127.0.0.3"]
    assert envs.parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ("gpu[3-1]", "gpu[001-", ""):
        with pytest.raises(UsageError):
            envs.expand_nodelist(bad)


def test_two_nodes_two_ranks_each(monkeypatch):
    for name in (envs.CPU_NUM, envs.OMP_NUM_THREADS):   # set here, the contract leaves them
        monkeypatch.delenv(name, raising=False)         # (an earlier in-process test may)
    base = envs.slurm_ports(4242, 0, 2)
    assert 20000 <= base < 32000 and base == envs.slurm_ports(4242, 0, 2)
    got = [envs.from_slurm(task(r, r % 2, r // 2)) for r in range(4)]
    endpoints = [f"gpu001:{base + 1}", f"gpu001:{base + 2}", f"gpu002:{base + 1}",
                 f"gpu002:{base + 2}"]
    for rank, env in enumerate(got):
        assert env["PADDLE_TRAINER_ID"] == env["RANK"] == str(rank)
        assert env["PADDLE_TRAINERS_NUM"] == env["WORLD_SIZE"] == "4"
        assert env["PADDLE_LOCAL_RANK"] == env["LOCAL_RANK"] == str(rank % 2)
        assert env["PADDLE_LOCAL_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["PADDLE_NNODES"] == "2" and env["CROSS_RANK"] == str(rank // 2)
        assert env["PADDLE_TRAINER_ENDPOINTS"] == ",".join(endpoints)
        assert env["PADDLE_CURRENT_ENDPOINT"] == endpoints[rank]
        # the job's first node, not the host srun ran on (SLURM_LAUNCH_NODE_IPADDR)
        assert env["MASTER_ADDR"] == "gpu001" and env["MASTER_PORT"] == str(base)
        assert env["PADDLE_MASTER"] == f"gpu001:{base}"
        assert env["PADDLE_DISTRI_BACKEND"] == "gloo" and "CUDA_VISIBLE_DEVICES" not in env
        assert env["OMP_NUM_THREADS"] == "4"          # 8 CPUs of the node / 2 ranks
    # the runtime reads the same from the bare SLURM_* variables
    d = envs.read(task(3, 1, 1))
    assert (d.rank, d.world_size, d.local_rank, d.local_size, d.nnodes, d.mode) == (
        3, 4, 1, 2, 2, "collective")
    assert d.master == f"gpu001:{base}" and d.trainer_endpoints == endpoints


def test_ports_differ_per_job_and_step_and_user_port_wins():
    blocks = {envs.slurm_ports(job, step, 4) for job in range(1000, 1100) for step in range(4)}
    assert len(blocks) == 400
    env = envs.from_slurm(task(1, 1, 0, MASTER_PORT="29500"))
    assert env["PADDLE_MASTER"] == "gpu001:29500" and env["MASTER_PORT"] == "29500"


def test_a_requeued_job_derives_other_ports_than_its_killed_run():
    """A requeued job keeps its id and starts its steps at 0 again; the killed run's rank 0 may
    still hold the old master port on the same node (seen: "Address already in use")."""
    first = envs.from_slurm(task(0, 0, 0))
    again = envs.from_slurm(task(0, 0, 0, SLURM_RESTART_COUNT="1"))
    assert first["MASTER_PORT"] != again["MASTER_PORT"]
    assert again["MASTER_PORT"] == str(envs.slurm_ports(4242, 0, 2, 1))
    ports = lambda env: {int(env["MASTER_PORT"]), *(int(e.rsplit(":", 1)[1]) for e in  # noqa: E731
                         env["PADDLE_TRAINER_ENDPOINTS"].split(","))}
    assert not ports(first) & ports(again)
    assert envs.from_slurm(task(0, 0, 0, SLURM_RESTART_COUNT="0")) == first


def test_uneven_and_cyclic_layouts():
    env = envs.from_slurm(task(2, 0, 1, tpn="2,1", ntasks=3))
    assert env["PADDLE_LOCAL_SIZE"] == "1" and env["PADDLE_CURRENT_ENDPOINT"].startswith("gpu002:")
    layout = envs.slurm_layout(["a", "b"], [2, 2], "cyclic:block")
    assert layout.node_of == [0, 1, 0, 1] and layout.local_of == [0, 0, 1, 1]
    env = envs.from_slurm(task(1, 0, 1, SLURM_DISTRIBUTION="cyclic"))
    assert env["PADDLE_TRAINER_ENDPOINTS"].split(",")[1].startswith("gpu002:")
    # a task whose place the layout does not give (plane, arbitrary): refused, not guessed
    with pytest.raises(UsageError, match="do not give"):
        envs.from_slurm(task(1, 0, 1))


def test_gpus_from_slurm_binding():
    # node-wide binding: every task sees the node's GPUs and uses index LOCALID
    env = envs.from_slurm(task(1, 1, 0, CUDA_VISIBLE_DEVICES="2,3"))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["FLAGS_selected_gpus"] == "1"
    assert env["PADDLE_DISTRI_BACKEND"] == "nccl" and env["PADDLE_WORLD_DEVICE_IDS"] == "0,1,0,1"
    # one GPU bound per task (--gpus-per-task=1): index 0 of what Slurm left visible
    env = envs.from_slurm(task(3, 1, 1, CUDA_VISIBLE_DEVICES="3"))
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["FLAGS_selected_gpus"] == "0"
    assert envs.from_slurm(task(0, 0, 0, CUDA_VISIBLE_DEVICES="NoDevFiles"))[
        "PADDLE_DISTRI_BACKEND"] == "gloo"


def test_requeue_count_and_token():
    env = envs.from_slurm(task(0, 0, 0, SLURM_RESTART_COUNT="2", FLUIDCTL_JOB_TOKEN="s3"))
    assert env["PADDLE_RESTART_COUNT"] == "2" and env["FLUIDCTL_JOB_TOKEN"] == "s3"


def test_batch_script_and_launcher_contract_are_left_alone():
    # a batch script (or salloc shell) has SLURM_PROCID=0 and SLURM_NTASKS but is no srun task
    batch = task(0, 0, 0)
    del batch["SLURM_STEP_NUM_TASKS"], batch["SLURM_STEP_ID"]
    assert not envs.in_slurm_step(batch)
    assert envs.read(batch).mode == "single"
    # a rank fluidctl started under srun already has the contract: it is not re-derived
    launched = task(3, 1, 1, PADDLE_TRAINER_ID="3", PADDLE_TRAINERS_NUM="4",
                    PADDLE_MASTER="10.0.0.1:6000")
    assert envs.read(launched).master == "10.0.0.1:6000"


def test_missing_or_bad_variables_are_one_line_errors():
    env = task(0, 0, 0)
    del env["SLURM_JOB_ID"]
    with pytest.raises(UsageError, match="SLURM_JOB_ID is not set"):
        envs.from_slurm(env)
    with pytest.raises(UsageError, match="not a number"):
        envs.from_slurm(task("x", 0, 0))
    with pytest.raises(UsageError, match="2 node"):
        envs.from_slurm(task(0, 0, 0, tpn="4"))


def test_a_tasks_place_is_worked_out_once_per_environment(monkeypatch):
    """The worker asks for the contract, the node's endpoints and the node join: the node list
    and layout (O(world)) are worked out once, and again only for other inputs."""
    from fluidctl.envs import slurm
    calls = []
    real = slurm._place_task
    monkeypatch.setattr(slurm, "_place_task", lambda environ: calls.append(1) or real(environ))
    monkeypatch.setattr(slurm, "_last_task", [])
    env = task(1, 1, 0)
    contract = envs.from_slurm(env)
    assert envs.slurm_node_endpoints(env) == {0: contract["PADDLE_TRAINER_ENDPOINTS"].split(",")[0],
                                              1: contract["PADDLE_CURRENT_ENDPOINT"]}
    envs.from_slurm(dict(env))
    assert len(calls) == 1
    other = envs.from_slurm(task(2, 0, 1))
    assert len(calls) == 2 and other["PADDLE_TRAINER_ID"] == "2"
