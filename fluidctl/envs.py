"""THE environment contract between the launcher and training processes.

The planner writes it (``collective_env``, ``pserver_env``), the runtime reads it (``read``), and
``fluidctl worker`` translates OpenMPI's variables into it (``from_ompi``). Nothing else in the
project spells a ``PADDLE_*`` name: import the constant from here.

The names are PaddlePaddle's, so unmodified Paddle scripts run; torch's (RANK, WORLD_SIZE,
MASTER_ADDR, ...) are written beside them, so torch DDP scripts run too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

# --- rank and size -------------------------------------------------------------------------
TRAINER_ID = "PADDLE_TRAINER_ID"
GLOBAL_RANK = "PADDLE_GLOBAL_RANK"
TORCH_RANK = "RANK"
TRAINERS_NUM = "PADDLE_TRAINERS_NUM"
NUM_TRAINERS = "PADDLE_NUM_TRAINERS"
GLOBAL_SIZE = "PADDLE_GLOBAL_SIZE"
TORCH_WORLD_SIZE = "WORLD_SIZE"
RANK_IN_NODE = "PADDLE_RANK_IN_NODE"
LOCAL_RANK = "PADDLE_LOCAL_RANK"
TORCH_LOCAL_RANK = "LOCAL_RANK"
LOCAL_SIZE = "PADDLE_LOCAL_SIZE"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NNODES = "PADDLE_NNODES"
# DeepSpeed's launcher names (DeepSpeed reads LOCAL_SIZE to count devices and to enable its CPU
# shared-memory allreduce; CROSS_* are horovod's and DeepSpeed's node rank and node count)
DS_LOCAL_SIZE = "LOCAL_SIZE"
CROSS_RANK = "CROSS_RANK"
CROSS_SIZE = "CROSS_SIZE"
# --- endpoints ------------------------------------------------------------------------------
CURRENT_ENDPOINT = "PADDLE_CURRENT_ENDPOINT"
TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"
MASTER = "PADDLE_MASTER"
TORCH_MASTER_ADDR = "MASTER_ADDR"
TORCH_MASTER_PORT = "MASTER_PORT"
# --- devices --------------------------------------------------------------------------------
SELECTED_GPUS = "FLAGS_selected_gpus"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
LOCAL_DEVICE_IDS = "PADDLE_LOCAL_DEVICE_IDS"
WORLD_DEVICE_IDS = "PADDLE_WORLD_DEVICE_IDS"
DISTRI_BACKEND = "PADDLE_DISTRI_BACKEND"
# --- role -----------------------------------------------------------------------------------
TRAINING_ROLE = "TRAINING_ROLE"
ROLE = "PADDLE_ROLE"
ROLE_TRAINER = "TRAINER"
ROLE_PSERVER = "PSERVER"
# --- threads --------------------------------------------------------------------------------
CPU_NUM = "CPU_NUM"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# --- supervision ----------------------------------------------------------------------------
RESTART_COUNT = "PADDLE_RESTART_COUNT"
# --- parameter-server mode ------------------------------------------------------------------
PSERVERS_IP_PORT_LIST = "PADDLE_PSERVERS_IP_PORT_LIST"
PORT = "PADDLE_PORT"
POD_IP = "POD_IP"
INIT_PORT = "PADDLE_INIT_PORT"
INIT_PSERVERS = "PADDLE_INIT_PSERVERS"
INIT_TRAINER_ID = "PADDLE_INIT_TRAINER_ID"
INIT_NUM_GRADIENT_SERVERS = "PADDLE_INIT_NUM_GRADIENT_SERVERS"
INIT_PORTS_NUM = "PADDLE_INIT_PORTS_NUM"
INIT_PORTS_NUM_FOR_SPARSE = "PADDLE_INIT_PORTS_NUM_FOR_SPARSE"
INIT_USE_GPU = "PADDLE_INIT_USE_GPU"
INIT_TRAINER_COUNT = "PADDLE_INIT_TRAINER_COUNT"
PSERVER_ID = "PADDLE_PSERVER_ID"
# --- fluidctl's own -------------------------------------------------------------------------
JOB_TOKEN = "FLUIDCTL_JOB_TOKEN"        # per-job secret for HMAC authentication on the wire
SYNC_MODE = "FLUIDCTL_SYNC_MODE"        # "sync" | "async" (parameter-server mode)
TIMEOUT = "FLUIDCTL_TIMEOUT"            # seconds a collective or rendezvous may wait
LOG_DIR = "FLUIDCTL_LOG_DIR"
SHM_DIRECT = "FLUIDCTL_SHM_DIRECT"      # "0": never read peers' memory (process_vm_readv)
# --- OpenMPI (read only) --------------------------------------------------------------------
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"

DEFAULT_TIMEOUT = 300.0


def read_token_file(path: str) -> str:
    """The job token kept in a file (whitespace stripped); a UsageError if unusable."""
    from fluidctl.errors import UsageError
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}",
                         "pass --token-file with a readable file holding the job token") from None
    if not token:
        raise UsageError(f"token file {path} is empty", "write the job token into it")
    return token


def split_endpoint(endpoint: str):
    """'host:port' -> (host, int(port)); IPv6 may be written '[::1]:port'."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def threads_per_process(cores: int, procs_on_node: int) -> int:
    return max(1, cores // max(1, procs_on_node))


def collective_env(*, rank: int, world_size: int, local_rank: int, local_size: int, nnodes: int,
                   endpoints: Sequence[str], master: str, node_rank: Optional[int] = None,
                   gpus_on_node: Sequence[str] = (),
                   world_device_ids: Sequence[Sequence[str]] = (), cores: int = 1,
                   user_env: Mapping[str, str] = (), restart_count: int = 0,
                   token: Optional[str] = None) -> Dict[str, str]:
    """Every variable a collective-mode rank gets, as DESIGN.md's table states it.

    ``gpus_on_node`` are the physical ids the job uses on this node: CUDA_VISIBLE_DEVICES lists
    all of them (so ``cuda:LOCAL_RANK`` works for torch) and FLAGS_selected_gpus is this rank's
    index into that list (Paddle's convention when CUDA_VISIBLE_DEVICES is set).
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
        CURRENT_ENDPOINT: endpoints[rank], TRAINER_ENDPOINTS: ",".join(endpoints),
        RANK_IN_NODE: str(local_rank), LOCAL_RANK: str(local_rank),
        TORCH_LOCAL_RANK: str(local_rank),
        LOCAL_SIZE: str(local_size), TORCH_LOCAL_WORLD_SIZE: str(local_size),
        NNODES: str(nnodes),
        DS_LOCAL_SIZE: str(local_size), CROSS_RANK: str(node_rank), CROSS_SIZE: str(nnodes),
        MASTER: master, TORCH_MASTER_ADDR: master_host, TORCH_MASTER_PORT: str(master_port),
        DISTRI_BACKEND: "nccl" if gpus_on_node else "gloo",
        TRAINING_ROLE: ROLE_TRAINER, ROLE: ROLE_TRAINER,
        RESTART_COUNT: str(restart_count),
        PYTHONUNBUFFERED: "1",
    }
    if gpus_on_node:
        env[CUDA_VISIBLE_DEVICES] = ",".join(gpus_on_node)
        env[SELECTED_GPUS] = str(local_rank)
        env[LOCAL_DEVICE_IDS] = str(local_rank)
        env[WORLD_DEVICE_IDS] = ":".join(",".join(ids) for ids in world_device_ids)
    threads = str(threads_per_process(cores, local_size))
    for name in (CPU_NUM, OMP_NUM_THREADS):
        if name not in user_env and name not in os.environ:
            env[name] = threads
    if token:
        env[JOB_TOKEN] = token
    env.update(user_env)
    return env


def pserver_env(*, role: str, index: int, trainers: int, pserver_endpoints: Sequence[str],
                trainer_endpoints: Sequence[str] = (), sync: bool = True, ports_num: int = 1,
                ports_num_for_sparse: int = 0, use_gpu: bool = False, trainer_count: int = 1,
                cores: int = 1, procs_on_node: int = 1, user_env: Mapping[str, str] = (),
                restart_count: int = 0, token: Optional[str] = None) -> Dict[str, str]:
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
            env[TRAINER_ENDPOINTS] = ",".join(trainer_endpoints)
    else:
        env[PSERVER_ID] = str(index)
        env[CURRENT_ENDPOINT] = own
    threads = str(threads_per_process(cores, procs_on_node))
    for name in (CPU_NUM, OMP_NUM_THREADS):
        if name not in user_env and name not in os.environ:
            env[name] = threads
    if token:
        env[JOB_TOKEN] = token
    env.update(user_env)
    return env


@dataclass
class DistEnv:
    """What a training process learns from its environment (read by ``fluidctl.runtime``)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    nnodes: int = 1
    role: str = ROLE_TRAINER
    mode: str = "collective"              # "collective" | "pserver" | "single"
    current_endpoint: str = ""
    trainer_endpoints: List[str] = field(default_factory=list)
    master: str = ""
    pserver_endpoints: List[str] = field(default_factory=list)
    pserver_id: int = 0
    sync: bool = True
    selected_gpu: Optional[int] = None    # index into CUDA_VISIBLE_DEVICES, None on CPU
    backend: str = "gloo"
    restart_count: int = 0
    token: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT
    under_mpi: bool = False


def _int(environ: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def read(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Parse the contract; OpenMPI's variables fill in what PADDLE_* leaves out."""
    environ = os.environ if environ is None else environ
    under_mpi = OMPI_RANK in environ
    pservers = [e for e in environ.get(PSERVERS_IP_PORT_LIST, "").split(",") if e]
    role = environ.get(TRAINING_ROLE, environ.get(ROLE, ROLE_TRAINER)).upper()
    world = _int(environ, TRAINERS_NUM, GLOBAL_SIZE, TORCH_WORLD_SIZE, OMPI_SIZE, default=1)
    endpoints = [e for e in environ.get(TRAINER_ENDPOINTS, "").split(",") if e]
    if pservers or role == ROLE_PSERVER:
        mode = "pserver"
    elif world > 1 or endpoints:
        mode = "collective"
    else:
        mode = "single"
    gpu = environ.get(SELECTED_GPUS, "")
    return DistEnv(
        rank=_int(environ, TRAINER_ID, GLOBAL_RANK, TORCH_RANK, OMPI_RANK, default=0),
        world_size=world,
        local_rank=_int(environ, LOCAL_RANK, RANK_IN_NODE, TORCH_LOCAL_RANK, OMPI_LOCAL_RANK,
                        default=0),
        local_size=_int(environ, LOCAL_SIZE, TORCH_LOCAL_WORLD_SIZE, OMPI_LOCAL_SIZE, default=1),
        nnodes=_int(environ, NNODES, default=1),
        role=role, mode=mode,
        current_endpoint=environ.get(CURRENT_ENDPOINT, ""),
        trainer_endpoints=endpoints,
        master=environ.get(MASTER) or (
            f"{environ[TORCH_MASTER_ADDR]}:{environ[TORCH_MASTER_PORT]}"
            if TORCH_MASTER_ADDR in environ and TORCH_MASTER_PORT in environ else
            (endpoints[0] if endpoints else "")),
        pserver_endpoints=pservers,
        pserver_id=_int(environ, PSERVER_ID, default=0),
        sync=environ.get(SYNC_MODE, "sync") != "async",
        selected_gpu=int(gpu.split(",")[0]) if gpu else None,
        backend=environ.get(DISTRI_BACKEND, "nccl" if gpu else "gloo"),
        restart_count=_int(environ, RESTART_COUNT, default=0),
        token=environ.get(JOB_TOKEN) or None,
        timeout=float(environ.get(TIMEOUT) or DEFAULT_TIMEOUT),
        under_mpi=under_mpi,
    )


def from_ompi(environ: Mapping[str, str], endpoints: Sequence[str], master: str,
              nnodes: int, node_rank: Optional[int] = None, cores: int = 1) -> Dict[str, str]:
    """``fluidctl worker`` under mpirun: OMPI_* plus exchanged endpoints -> the full contract."""
    rank = int(environ[OMPI_RANK])
    return collective_env(
        rank=rank, world_size=int(environ[OMPI_SIZE]),
        local_rank=int(environ.get(OMPI_LOCAL_RANK, 0)),
        local_size=int(environ.get(OMPI_LOCAL_SIZE, 1)),
        nnodes=nnodes, endpoints=endpoints, master=master, node_rank=node_rank, cores=cores,
        restart_count=int(environ.get(RESTART_COUNT) or 0), token=environ.get(JOB_TOKEN))
