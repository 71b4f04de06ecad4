"""A task of a plain ``srun`` step: SLURM_* mapped onto the whole contract (``from_slurm``), as
``fluidctl.envs.read.from_ompi`` does under mpirun, and the Slurm layout it is computed from.
The names are ``fluidctl.envs.names``'s.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

from fluidctl.envs.names import (
    CUDA_VISIBLE_DEVICES, JOB_TOKEN, LOCAL_DEVICE_IDS, NCCL_MULTI_RANK_GPU, NODE_LOCAL_NAMES,
    PSERVERS_IP_PORT_LIST, RESTART_COUNT, ROLE_PSERVER, ROLE_TRAINER, SELECTED_GPUS,
    SLURM_CPUS_ON_NODE, SLURM_DISTRIBUTION, SLURM_GPUS_ON_NODE, SLURM_JOB_ID, SLURM_JOB_NODELIST,
    SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, SLURM_PROCID, SLURM_RESTART_COUNT, SLURM_STEP_GPUS,
    SLURM_STEP_ID, SLURM_STEP_NODELIST, SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE,
    SLURM_TASKS_PER_NODE, SYNC_MODE, TORCH_MASTER_PORT, TRAINERS_NUM, TRAINING_ROLE,
    WORLD_DEVICE_IDS)
from fluidctl.envs.write import bounded, collective_env, pserver_env, shared_gpu_allowed

SLURM_PORT_LOW, SLURM_PORT_SPAN = 20000, 12000      # derived ports: 20000-31999, below Linux's
#                                                     ephemeral range (32768+)
REQUEUE_SHIFT = 1031        # blocks a requeued job's ports move by, per requeue (a prime)


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """A task of an ``srun`` step (a batch script or an salloc shell is not one)."""
    return bool(environ.get(SLURM_PROCID)) and bool(environ.get(SLURM_STEP_NUM_TASKS))


def expand_nodelist(nodelist: str) -> List[str]:
    """Slurm's compressed node list ('gpu[001-004,7]', '127.0.0.[2-3]') in Slurm's order.
    Parsed here (python-hostlist), never by asking ``scontrol show hostnames``, which
    containers often lack; an unparsable list is an error, never a silent 'localhost'."""
    from fluidctl.errors import UsageError
    import hostlist
    try:
        nodes = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as exc:
        raise UsageError(f"cannot parse Slurm node list {nodelist!r}: {exc}",
                         "check SLURM_JOB_NODELIST") from None
    if not nodes:
        raise UsageError("empty Slurm node list", "run inside a Slurm job (salloc, sbatch, srun)")
    return nodes


def parse_tasks_per_node(value: str) -> List[int]:
    """'2(x3),1' -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE's syntax)."""
    from fluidctl.errors import UsageError
    import hostlist
    try:
        return [int(n) for n in hostlist.parse_slurm_tasks_per_node(value)]
    except (ValueError, hostlist.BadHostlist):
        raise UsageError(f"cannot parse Slurm tasks per node {value!r}",
                         "check SLURM_TASKS_PER_NODE") from None


class SlurmLayout(NamedTuple):
    """Where every rank of a Slurm step runs: ``node_of[rank]`` (index into ``nodes``) and
    ``local_of[rank]``; block distribution (Slurm's default) or cyclic."""
    nodes: List[str]
    tasks_per_node: List[int]
    node_of: List[int]
    local_of: List[int]

    @property
    def world_size(self) -> int:
        return len(self.node_of)


def slurm_layout(nodes: Sequence[str], tasks_per_node: Sequence[int],
                 distribution: str = "block") -> SlurmLayout:
    from fluidctl.errors import UsageError
    if len(tasks_per_node) != len(nodes):
        raise UsageError(f"Slurm lists {len(nodes)} node(s) but tasks for "
                         f"{len(tasks_per_node)}", "check SLURM_TASKS_PER_NODE")
    node_of: List[int] = []
    if distribution.split(":")[0].split(",")[0] == "cyclic":
        left = list(tasks_per_node)
        while any(left):
            for i, n in enumerate(left):
                if n:
                    node_of.append(i)
                    left[i] -= 1
    else:
        for i, n in enumerate(tasks_per_node):
            node_of += [i] * n
    seen = [0] * len(nodes)
    local_of = []
    for i in node_of:
        local_of.append(seen[i])
        seen[i] += 1
    return SlurmLayout(list(nodes), list(tasks_per_node), node_of, local_of)


def slurm_ports(job_id: int, step_id: int, local_size: int, restarts: int = 0) -> int:
    """The first of a block of ports derived from the job and step ids: the master port, then
    one per local rank (rank endpoints are base+1+local_rank). Deterministic, so every task
    computes the same ports without talking to the others; the first 4 steps of a job, and
    hundreds of consecutive jobs (12000 / 4 / block size), get disjoint blocks. A requeued job
    keeps its id and numbers its steps from 0 again, so ``restarts`` (SLURM_RESTART_COUNT)
    moves the block: the killed run's rank 0 may still hold its master port on the same node
    when the new run starts. MASTER_PORT set by the user wins for the master."""
    stride = (local_size + 1 + 3) // 4 * 4
    slots = SLURM_PORT_SPAN // stride
    return SLURM_PORT_LOW + ((job_id * 4 + step_id + REQUEUE_SHIFT * restarts) % slots) * stride


def slurm_pserver_port(job_id: int) -> int:
    """The port of a job's parameter servers under the Slurm backend (one per node):
    32000-32767, from the job id."""
    return 32000 + (job_id * 4) % 768


def _endpoint_of(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def slurm_visible_gpus(environ: Mapping[str, str]) -> List[str]:
    """CUDA_VISIBLE_DEVICES as Slurm set it for this task ([] without GPUs)."""
    value = environ.get(CUDA_VISIBLE_DEVICES, "").strip()
    if not value or value == "NoDevFiles":
        return []
    return [g for g in value.split(",") if g]


def _refuse_shared_slurm_gpus(environ: Mapping[str, str], gpus: Sequence[str],
                              local_size: int) -> None:
    """Slurm's binding gives local task i the visible GPU i % len(gpus) (node-wide binding)
    or the one it sees (one GPU bound per task): refuse when that puts two of the node's tasks
    on one physical GPU (more tasks than visible GPUs; one visible GPU each but fewer step GPUs
    on the node than tasks: SLURM_STEP_GPUS, else SLURM_GPUS_ON_NODE), unless NCCL_MULTI_RANK_GPU_ENABLE=1."""
    if local_size <= 1:
        return
    if len(gpus) > 1:
        shared = local_size > len(gpus)
        count = len(gpus)
    else:        # one GPU each: shared when the node has fewer for the step than tasks
        step = [g for g in environ.get(SLURM_STEP_GPUS, "").split(",") if g.strip()]
        on_node = environ.get(SLURM_GPUS_ON_NODE, "")
        count = len(step) if step else (int(on_node) if on_node.isdigit() else 0)
        shared = 0 < count < local_size          # unknown (neither set): Slurm's binding
    if shared and not shared_gpu_allowed(environ):
        from fluidctl.errors import UsageError
        raise UsageError(
            f"Slurm runs {local_size} tasks on this node with {count} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={','.join(gpus)}), so tasks would share a GPU, which NCCL "
            "refuses (\"Duplicate GPU detected\")",
            f"ask for one GPU per task (srun --gpus-per-task=1, or --ntasks-per-node equal to "
            f"the GPUs), or with NCCL >= 2.30 set {NCCL_MULTI_RANK_GPU}=1")


class _Task(NamedTuple):
    """Where a task of ``srun`` sits in its step (``from_slurm``'s first half)."""
    rank: int
    local_rank: int
    node_rank: int
    world: int
    nodes: List[str]
    tpn: List[int]
    layout: "SlurmLayout"
    base: int
    endpoints: List[str]


# what ``_task`` reads: a task's worker asks for it up to three times (the contract, the
# node's endpoints file, the node join), and at thousands of ranks each is O(world)
_TASK_INPUTS = (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_TASKS, SLURM_NTASKS,
                SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, "SLURM_NODELIST",
                SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_DISTRIBUTION,
                SLURM_JOB_ID, "SLURM_JOBID", SLURM_STEP_ID, SLURM_RESTART_COUNT)
_last_task: list = []       # [(inputs, _Task)] of the last call


def _task(environ: Mapping[str, str]) -> _Task:
    """This task's place (see ``_Task``), computed once per set of inputs."""
    inputs = tuple(environ.get(name) for name in _TASK_INPUTS)
    if _last_task and _last_task[0][0] == inputs:
        return _last_task[0][1]
    task = _place_task(environ)
    _last_task[:] = [(inputs, task)]
    return task


def _place_task(environ: Mapping[str, str]) -> _Task:
    from fluidctl.errors import UsageError

    def number(name: str, *fallbacks: str) -> int:
        for key in (name,) + fallbacks:
            value = environ.get(key, "")
            if value:
                try:
                    return int(value)
                except ValueError:
                    raise UsageError(f"{key}={value!r} is not a number",
                                     "run under srun, which sets it") from None
        raise UsageError(f"{name} is not set", "run each rank with srun inside a Slurm job")

    rank, local_rank = number(SLURM_PROCID), number(SLURM_LOCALID)
    node_rank = number(SLURM_NODEID)
    world = number(SLURM_STEP_NUM_TASKS, SLURM_NTASKS)
    nodes = expand_nodelist(environ.get(SLURM_STEP_NODELIST) or environ.get(SLURM_JOB_NODELIST)
                            or environ.get("SLURM_NODELIST", ""))
    tpn = parse_tasks_per_node(environ.get(SLURM_STEP_TASKS_PER_NODE)
                               or environ.get(SLURM_TASKS_PER_NODE) or "")
    layout = slurm_layout(nodes, tpn, environ.get(SLURM_DISTRIBUTION, "block"))
    if (layout.world_size != world or rank >= world or layout.node_of[rank] != node_rank
            or layout.local_of[rank] != local_rank):
        raise UsageError(
            f"Slurm task {rank} is task {local_rank} of node {node_rank}, which the node list "
            f"and tasks per node ({', '.join(map(str, tpn))}) do not give",
            "use srun's default block (or cyclic) distribution")
    job_id = number(SLURM_JOB_ID, "SLURM_JOBID")
    step = environ.get(SLURM_STEP_ID, "0")
    requeues = environ.get(SLURM_RESTART_COUNT, "0")
    base = slurm_ports(job_id, int(step) if step.isdigit() else 0, max(tpn),
                       int(requeues) if requeues.isdigit() else 0)
    endpoints = [_endpoint_of(nodes[n], base + 1 + local)
                 for n, local in zip(layout.node_of, layout.local_of)]
    return _Task(rank, local_rank, node_rank, world, nodes, tpn, layout, base, endpoints)


def slurm_node_endpoints(environ: Mapping[str, str]) -> Dict[int, str]:
    """{rank: endpoint} of the ranks on this task's node (ENDPOINTS_FILE's content, where the
    world's list is too long for the environment)."""
    t = _task(environ)
    return {r: t.endpoints[r] for r in range(t.world) if t.layout.node_of[r] == t.node_rank}


def from_slurm(environ: Mapping[str, str], cores: Optional[int] = None) -> Dict[str, str]:
    """A task of ``srun``: SLURM_* -> the whole contract, as ``from_ompi`` does under mpirun.

    Ranks, sizes and the node of every rank come from SLURM_PROCID / LOCALID / NODEID /
    NTASKS and the step's node list and tasks per node; MASTER_ADDR is the step's first node
    (never SLURM_LAUNCH_NODE_IPADDR, the host srun ran on); ports from ``slurm_ports`` (or
    MASTER_PORT when set); GPUs are Slurm's binding: CUDA_VISIBLE_DEVICES is kept as Slurm set
    it, and this rank uses the device at index LOCALID (node-wide binding) or 0 (one GPU bound
    per task)."""
    t = _task(environ)
    rank, local_rank, node_rank, world = t.rank, t.local_rank, t.node_rank, t.world
    nodes, tpn, layout, base, endpoints = t.nodes, t.tpn, t.layout, t.base, t.endpoints
    master_port = int(environ.get(TORCH_MASTER_PORT) or base)
    gpus = slurm_visible_gpus(environ)
    local_size = tpn[node_rank]
    if cores is None:
        cores = int(environ.get(SLURM_CPUS_ON_NODE) or os.cpu_count() or 1)
    env = collective_env(
        rank=rank, world_size=world, local_rank=local_rank, local_size=local_size,
        nnodes=len(nodes), node_rank=node_rank, endpoints=endpoints,
        master=_endpoint_of(nodes[0], master_port), gpus_on_node=gpus,
        world_device_ids=[gpus] * len(nodes), cores=cores,
        restart_count=int(environ.get(RESTART_COUNT) or environ.get(SLURM_RESTART_COUNT) or 0),
        token=environ.get(JOB_TOKEN))
    if gpus:
        _refuse_shared_slurm_gpus(environ, gpus, local_size)

        def index(local: int) -> str:
            return str(local % len(gpus) if len(gpus) > 1 else 0)
        env[CUDA_VISIBLE_DEVICES] = ",".join(gpus)          # Slurm's binding, MIG or not
        env[SELECTED_GPUS] = env[LOCAL_DEVICE_IDS] = index(local_rank)
        devices = bounded(",".join(index(local) for local in layout.local_of))
        env.pop(WORLD_DEVICE_IDS, None)
        if devices is not None:
            env[WORLD_DEVICE_IDS] = devices
    pservers = [e for e in environ.get(PSERVERS_IP_PORT_LIST, "").split(",") if e]
    if not pservers:
        return env
    # pserver mode (the Slurm backend's two steps): the step's role is in TRAINING_ROLE
    common = dict(pserver_endpoints=pservers, sync=environ.get(SYNC_MODE, "sync") != "async",
                  use_gpu=bool(gpus), cores=cores, procs_on_node=local_size,
                  restart_count=int(env[RESTART_COUNT]), token=environ.get(JOB_TOKEN))
    if environ.get(TRAINING_ROLE, ROLE_TRAINER).upper() == ROLE_PSERVER:
        return pserver_env(role=ROLE_PSERVER, index=rank,
                           trainers=int(environ.get(TRAINERS_NUM) or 1), **common)
    trainer = pserver_env(role=ROLE_TRAINER, index=rank, trainers=world,
                          trainer_endpoints=endpoints, **common)
    trainer.update({k: env[k] for k in NODE_LOCAL_NAMES if k in env})
    return trainer
