"""Writing the environment contract: what the planner gives each process (``collective_env``,
``pserver_env``), and the device and thread views it is made of. The names are
``fluidctl.envs.names``'s.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, NamedTuple, Optional, Sequence

from fluidctl.envs.names import (
    CPU_NUM, CROSS_RANK, CROSS_SIZE, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, CURRENT_ENDPOINT,
    DISTRI_BACKEND, DS_LOCAL_SIZE, ENV_BOUND, GLOBAL_RANK, GLOBAL_SIZE, INIT_NUM_GRADIENT_SERVERS, INIT_PORT,
    INIT_PORTS_NUM, INIT_PORTS_NUM_FOR_SPARSE, INIT_PSERVERS, INIT_TRAINER_COUNT, INIT_TRAINER_ID,
    INIT_USE_GPU, JOB_TOKEN, LOCAL_DEVICE_IDS, LOCAL_RANK, LOCAL_SIZE, MASTER, NCCL_MULTI_RANK_GPU,
    NNODES, NUM_TRAINERS, OMP_NUM_THREADS, POD_IP, PORT, PSERVERS_IP_PORT_LIST, PSERVER_ID,
    PYTHONUNBUFFERED, RANK_IN_NODE, RESTART_COUNT, ROLE, ROLE_PSERVER, ROLE_TRAINER, SELECTED_GPUS,
    SYNC_MODE, TORCH_LOCAL_RANK, TORCH_LOCAL_WORLD_SIZE, TORCH_MASTER_ADDR, TORCH_MASTER_PORT,
    TORCH_RANK, TORCH_RESTART_COUNT, TORCH_WORLD_SIZE, TRAINERS_NUM, TRAINER_ENDPOINTS, TRAINER_ID,
    TRAINING_ROLE, WORLD_DEVICE_IDS)


def split_endpoint(endpoint: str):
    """'host:port' -> (host, int(port)); IPv6 may be written '[::1]:port'."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def threads_per_process(cores: int, procs_on_node: int) -> int:
    return max(1, cores // max(1, procs_on_node))


def is_mig(device: str) -> bool:
    return device.startswith("MIG-")


def device_view(gpus_on_node: Sequence[str], local_rank: int):
    """(CUDA_VISIBLE_DEVICES, index into it) of the node's ``local_rank``-th device. A MIG
    instance (``MIG-<uuid>``) is seen alone (CUDA shows a process one instance): index 0; a
    whole GPU is seen among the node's other whole GPUs, decided per entry (a list may mix
    both: ``0,MIG-a,MIG-b``)."""
    own = gpus_on_node[local_rank % len(gpus_on_node)]
    if is_mig(own):
        return own, 0
    whole = [g for g in gpus_on_node if not is_mig(g)]
    return ",".join(whole), whole.index(own)


def world_device_list(world_device_ids: Sequence[Sequence[str]]) -> str:
    """PADDLE_WORLD_DEVICE_IDS as Paddle writes it (fleet/launch_utils.py,
    start_local_trainers): one entry per trainer in rank order, comma-separated, each the
    trainer's device index relative to its own CUDA_VISIBLE_DEVICES ("0,1,0,1" for two nodes
    of two GPUs). ``world_device_ids`` holds each node's GPUs, one trainer per GPU."""
    return ",".join(str(device_view(ids, local)[1])
                    for ids in world_device_ids for local in range(len(ids)))


def bounded(text: str) -> Optional[str]:
    """``text``, or None when it is over ENV_BOUND: a job-wide list that long stays out of a
    rank's environment (execve refuses one string over 128 KiB)."""
    return text if len(text) <= ENV_BOUND else None


class WorldStrings(NamedTuple):
    """The job-wide values every rank's environment repeats (PADDLE_TRAINER_ENDPOINTS,
    PADDLE_WORLD_DEVICE_IDS), joined once per plan: built per rank they make planning O(N^2)
    and hold N copies of an O(N) string. None: over ENV_BOUND, so left out (the ranks read
    their node's endpoints from ENDPOINTS_FILE instead)."""
    trainer_endpoints: Optional[str]
    world_devices: Optional[str]

    @property
    def listed(self) -> bool:
        """Whether the ranks get the whole endpoint list in their environment."""
        return self.trainer_endpoints is not None


def world_strings(endpoints: Sequence[str],
                  world_device_ids: Sequence[Sequence[str]] = ()) -> WorldStrings:
    return WorldStrings(_joined(endpoints),
                        bounded(world_device_list(world_device_ids)) if world_device_ids else "")


def _joined(items: Sequence[str]) -> Optional[str]:
    """``",".join(items)`` unless it would be over ENV_BOUND (decided before joining)."""
    if sum(len(i) + 1 for i in items) - 1 > ENV_BOUND:
        return None
    return ",".join(items)


def endpoints_file_text(endpoints: Mapping[int, str]) -> str:
    """ENDPOINTS_FILE's content: one "<rank> <endpoint>" line per rank of the node."""
    return "".join(f"{rank} {ep}\n" for rank, ep in sorted(endpoints.items()))


def shared_gpu_allowed(*environs: Mapping[str, str]) -> bool:
    return any(e.get(NCCL_MULTI_RANK_GPU, "").strip() == "1" for e in environs)


def refuse_shared_gpus(where: str, devices: Sequence[str], physical: Sequence[str],
                       *environs: Mapping[str, str]) -> None:
    """A UsageError when two local ranks' ``devices`` are one physical GPU (``physical[i]``:
    MIG siblings, the same GPU twice): NCCL <= 2.29 refuses that at init ("Duplicate GPU
    detected"), NCCL >= 2.30 unless NCCL_MULTI_RANK_GPU_ENABLE=1, which allows it here too."""
    if shared_gpu_allowed(*environs):
        return
    from fluidctl.errors import UsageError
    seen: Dict[str, int] = {}
    for local, (device, gpu) in enumerate(zip(devices, physical)):
        if gpu in seen:
            first = seen[gpu]
            same = "" if devices[first] == device == gpu else \
                f" ({devices[first]} and {device})"
            raise UsageError(
                f"{where}: local ranks {first} and {local} would share physical GPU {gpu}"
                f"{same}, which NCCL refuses (\"Duplicate GPU detected\")",
                f"give each rank its own GPU, or with NCCL >= 2.30 set "
                f"{NCCL_MULTI_RANK_GPU}=1")
        seen[gpu] = local


def _finish(env: Dict[str, str], threads: int, user_env: Mapping[str, str],
            token: Optional[str]) -> Dict[str, str]:
    """What every role's environment ends with: CPU_NUM/OMP_NUM_THREADS unless the user (or
    this environment) set them, the job token, then the user's own variables over all."""
    for name in (CPU_NUM, OMP_NUM_THREADS):
        if name not in user_env and name not in os.environ:
            env[name] = str(threads)
    if token:
        env[JOB_TOKEN] = token
    env.update(user_env)
    return env


def collective_env(*, rank: int, world_size: int, local_rank: int, local_size: int, nnodes: int,
                   endpoints: Sequence[str], master: str, node_rank: Optional[int] = None,
                   gpus_on_node: Sequence[str] = (),
                   world_device_ids: Sequence[Sequence[str]] = (), cores: int = 1,
                   user_env: Mapping[str, str] = (), restart_count: int = 0,
                   token: Optional[str] = None,
                   world: Optional[WorldStrings] = None) -> Dict[str, str]:
    """Every variable a collective-mode rank gets, as DESIGN.md's table states it.

    ``gpus_on_node`` are the physical ids the job uses on this node: CUDA_VISIBLE_DEVICES lists
    all of them (so ``cuda:LOCAL_RANK`` works for torch) and FLAGS_selected_gpus is this rank's
    index into that list (Paddle's convention when CUDA_VISIBLE_DEVICES is set), with
    CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA's numbering is nvidia-smi's. MIG instances
    (``MIG-<uuid>``) are different: CUDA shows a process one of them only, so each rank's
    CUDA_VISIBLE_DEVICES is its own instance and its index is 0.
    ``node_rank`` is this node's index among the job's nodes; it defaults to rank // local_size,
    which is right only when every node runs the same number of ranks.
    """
    user_env = dict(user_env)
    if node_rank is None:
        node_rank = rank // max(1, local_size)
    master_host, master_port = split_endpoint(master)
    env = {
        TRAINER_ID: str(rank), GLOBAL_RANK: str(rank), TORCH_RANK: str(rank),
        TRAINERS_NUM: str(world_size), NUM_TRAINERS: str(world_size),
        GLOBAL_SIZE: str(world_size), TORCH_WORLD_SIZE: str(world_size),
        CURRENT_ENDPOINT: endpoints[rank],
        RANK_IN_NODE: str(local_rank), LOCAL_RANK: str(local_rank),
        TORCH_LOCAL_RANK: str(local_rank),
        LOCAL_SIZE: str(local_size), TORCH_LOCAL_WORLD_SIZE: str(local_size),
        NNODES: str(nnodes),
        DS_LOCAL_SIZE: str(local_size), CROSS_RANK: str(node_rank), CROSS_SIZE: str(nnodes),
        MASTER: master, TORCH_MASTER_ADDR: master_host, TORCH_MASTER_PORT: str(master_port),
        DISTRI_BACKEND: "nccl" if gpus_on_node else "gloo",
        TRAINING_ROLE: ROLE_TRAINER, ROLE: ROLE_TRAINER,
        RESTART_COUNT: str(restart_count), TORCH_RESTART_COUNT: str(restart_count),
        PYTHONUNBUFFERED: "1",
    }
    if world is None:
        world = world_strings(endpoints, world_device_ids or [gpus_on_node])
    elif not world_device_ids and gpus_on_node:     # the caller's WorldStrings lack devices
        world = world._replace(world_devices=bounded(world_device_list([gpus_on_node])))
    if world.trainer_endpoints is not None:
        env[TRAINER_ENDPOINTS] = world.trainer_endpoints
    if gpus_on_node:
        visible, index = device_view(gpus_on_node, local_rank)
        env[CUDA_VISIBLE_DEVICES] = visible
        env[SELECTED_GPUS] = env[LOCAL_DEVICE_IDS] = str(index)
        if world.world_devices is not None:
            env[WORLD_DEVICE_IDS] = world.world_devices
        if CUDA_DEVICE_ORDER not in os.environ:
            env[CUDA_DEVICE_ORDER] = "PCI_BUS_ID"
    return _finish(env, threads_per_process(cores, local_size), user_env, token)


def pserver_env(*, role: str, index: int, trainers: int, pserver_endpoints: Sequence[str],
                trainer_endpoints: Sequence[str] = (), sync: bool = True, ports_num: int = 1,
                ports_num_for_sparse: int = 0, use_gpu: bool = False, trainer_count: int = 1,
                cores: int = 1, procs_on_node: int = 1, user_env: Mapping[str, str] = (),
                restart_count: int = 0, token: Optional[str] = None,
                world: Optional[WorldStrings] = None) -> Dict[str, str]:
    """Parameter-server mode: ``role`` is ROLE_PSERVER or ROLE_TRAINER, ``index`` its id in that
    role. Adds the fluid names and the v2 ``PADDLE_INIT_*`` names the seeds document."""
    user_env = dict(user_env)
    own = pserver_endpoints[index] if role == ROLE_PSERVER else (
        trainer_endpoints[index] if trainer_endpoints else "")
    pod_ip, port = split_endpoint(own) if own else ("127.0.0.1", 0)
    env = {
        TRAINING_ROLE: role, ROLE: role,
        PSERVERS_IP_PORT_LIST: ",".join(pserver_endpoints),
        TRAINERS_NUM: str(trainers), NUM_TRAINERS: str(trainers),
        TORCH_WORLD_SIZE: str(trainers), GLOBAL_SIZE: str(trainers),
        POD_IP: pod_ip, PORT: str(port),
        INIT_PORT: str(port), INIT_PSERVERS: ",".join(split_endpoint(e)[0] for e in pserver_endpoints),
        INIT_NUM_GRADIENT_SERVERS: str(trainers), INIT_PORTS_NUM: str(ports_num),
        INIT_PORTS_NUM_FOR_SPARSE: str(ports_num_for_sparse),
        INIT_USE_GPU: "1" if use_gpu else "0", INIT_TRAINER_COUNT: str(trainer_count),
        SYNC_MODE: "sync" if sync else "async",
        RESTART_COUNT: str(restart_count), PYTHONUNBUFFERED: "1",
    }
    if role == ROLE_TRAINER:
        env.update({TRAINER_ID: str(index), GLOBAL_RANK: str(index), TORCH_RANK: str(index),
                    INIT_TRAINER_ID: str(index)})
        if trainer_endpoints:
            env[CURRENT_ENDPOINT] = own
            listed = world.trainer_endpoints if world else _joined(trainer_endpoints)
            if listed is not None:
                env[TRAINER_ENDPOINTS] = listed
    else:
        env[PSERVER_ID] = str(index)
        env[CURRENT_ENDPOINT] = own
    return _finish(env, threads_per_process(cores, procs_on_node), user_env, token)
