"""THE environment contract between the launcher and training processes.

The planner writes it (``collective_env``, ``pserver_env``), the runtime reads it (``read``), and
``fluidctl worker`` translates OpenMPI's variables (``from_ompi``) or Slurm's (``from_slurm``) into
it. Nothing else in the
project spells a ``PADDLE_*`` name: import the constant from here.

The names are PaddlePaddle's, so unmodified Paddle scripts run; torch's (RANK, WORLD_SIZE,
MASTER_ADDR, ...) are written beside them, so torch DDP scripts run too.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

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
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"   # PCI_BUS_ID: CUDA numbers GPUs as nvidia-smi does
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
TORCH_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"     # torchrun's name for the same count
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
K8S_NODE_BASE = "FLUIDCTL_K8S_NODE_BASE"  # a Kubernetes pod's first node in the plan (render)
K8S_NODE_INDEX = "FLUIDCTL_K8S_INDEX"     # its index in its replica set (downward API)
JOB_TOKEN = "FLUIDCTL_JOB_TOKEN"        # per-job secret for HMAC authentication on the wire
SYNC_MODE = "FLUIDCTL_SYNC_MODE"        # "sync" | "async" (parameter-server mode)
TIMEOUT = "FLUIDCTL_TIMEOUT"            # seconds a collective or rendezvous may wait
LOG_DIR = "FLUIDCTL_LOG_DIR"
GPUS = "FLUIDCTL_GPUS"                  # "all" or a --gpus value: ranks started by mpirun or
                                        # torchrun take the node's GPUs by local rank
VENV = "FLUIDCTL_VENV"                  # the nodes' environment (cluster setup, train, check)
DIAG_DIR = "FLUIDCTL_DIAG_DIR"          # the node's progress counters / stack files (diagnostics/progress.py)
DIAG_WRITE = "FLUIDCTL_DIAG_WRITE"      # "mmap" | "pwrite": how a rank's pages reach DIAG_DIR (diagnostics/pages.py)
STEP_HOOKS = "FLUIDCTL_STEP_HOOKS"      # "0": no straggler marks in torch/Paddle ranks (inject/);
                                        # "backward": torch's backward calls, not its Flight Recorder
STEP_HOOKS_PID = "FLUIDCTL_STEP_HOOKS_PID"  # set by the rank that installed them: its children skip
TORCH_FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"  # torch's Flight Recorder entries (set unless given)
HANG_TIMEOUT = "FLUIDCTL_HANG_TIMEOUT"  # default of fluidctl train --hang-timeout
PYSPY = "FLUIDCTL_PYSPY"                # py-spy to use for stack dumps; empty: never py-spy
SHM_DIRECT = "FLUIDCTL_SHM_DIRECT"      # "0": never read peers' memory (process_vm_readv)
WORKER_ECHO = "FLUIDCTL_WORKER_ECHO"    # "0": fluidctl worker writes its log only, not stdout
HANDSHAKE_TIMEOUT = "FLUIDCTL_HANDSHAKE_TIMEOUT"  # seconds a new peer has to authenticate (10)
DROP_LOG_INTERVAL = "FLUIDCTL_DROP_LOG_INTERVAL"  # seconds per summary of dropped peers (10)
MAX_FRAME = "FLUIDCTL_MAX_FRAME"        # bytes a wire frame's payload may have (4 GiB)
# checkpoint requests (runtime/request.py): the file the launcher (or `fluidctl job checkpoint`)
# creates to ask for a checkpoint, and the signal it forwards to the ranks (a name: TERM, USR1)
CHECKPOINT_REQUEST = "FLUIDCTL_CHECKPOINT_REQUEST"
CHECKPOINT_SIGNAL = "FLUIDCTL_CHECKPOINT_SIGNAL"
CHECKPOINT_STATE = "FLUIDCTL_CHECKPOINT_STATE"  # where rank 0 records the last commit
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"     # read only: how often Slurm requeued the job

# --- NCCL (read only) -----------------------------------------------------------------------
NCCL_MULTI_RANK_GPU = "NCCL_MULTI_RANK_GPU_ENABLE"  # "1": NCCL >= 2.30 lets ranks share a GPU

# --- OpenMPI (read only) --------------------------------------------------------------------
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"

DEFAULT_TIMEOUT = 300.0


# how to make a token file, for every error about a missing or empty one
MAKE_TOKEN = ("make one: python -c \"import secrets; print(secrets.token_hex(32))\" > token; "
              "chmod 600 token")


def read_token_file(path: str) -> str:
    """The job token kept in a file (whitespace stripped); a UsageError if unusable."""
    from fluidctl.errors import UsageError
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}",
                         "pass --token-file with a readable file holding the job token; "
                         + MAKE_TOKEN) from None
    if not token:
        raise UsageError(f"token file {path} is empty", MAKE_TOKEN)
    return token


def split_endpoint(endpoint: str):
    """'host:port' -> (host, int(port)); IPv6 may be written '[::1]:port'."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def torch_port_taken(environ: Mapping[str, str], master: str) -> bool:
    """Whether MASTER_PORT is the port of fluidctl's own rendezvous store (PADDLE_MASTER), as
    the contract writes it. ``fluidctl.runtime.init()`` then serves its store there, so a
    script that also calls torch's ``dist.init_process_group`` (env://) would bind it twice
    (rank 0: EADDRINUSE) or knock on fluidctl's store (the others): ``init()`` replaces
    MASTER_PORT in ``os.environ`` by a free port rank 0 picked and published through the store,
    the same on every rank. Scripts that never call ``init()`` keep MASTER_PORT as written."""
    port = environ.get(TORCH_MASTER_PORT, "")
    if not master or not port.isdigit():
        return False
    try:
        return split_endpoint(master)[1] == int(port)
    except ValueError:
        return False


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


class WorldStrings(NamedTuple):
    """The job-wide values every rank's environment repeats (PADDLE_TRAINER_ENDPOINTS,
    PADDLE_WORLD_DEVICE_IDS), joined once per plan: built per rank they make planning O(N^2)
    and hold N copies of an O(N) string."""
    trainer_endpoints: str
    world_devices: str


def world_strings(endpoints: Sequence[str],
                  world_device_ids: Sequence[Sequence[str]] = ()) -> WorldStrings:
    return WorldStrings(",".join(endpoints),
                        world_device_list(world_device_ids) if world_device_ids else "")


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
        TRAINER_ENDPOINTS: world.trainer_endpoints if world else ",".join(endpoints),
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
    if gpus_on_node:
        visible, index = device_view(gpus_on_node, local_rank)
        env[CUDA_VISIBLE_DEVICES] = visible
        env[SELECTED_GPUS] = env[LOCAL_DEVICE_IDS] = str(index)
        env[WORLD_DEVICE_IDS] = (world.world_devices if world and world_device_ids else
                                 world_device_list(world_device_ids or [gpus_on_node]))
        if CUDA_DEVICE_ORDER not in os.environ:
            env[CUDA_DEVICE_ORDER] = "PCI_BUS_ID"
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
            env[TRAINER_ENDPOINTS] = (world.trainer_endpoints if world else
                                      ",".join(trainer_endpoints))
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


class DistEnv(NamedTuple):
    """What a training process learns from its environment (read by ``fluidctl.runtime``).
    Immutable (``env._replace(token=...)`` makes a changed copy). A NamedTuple, not a
    dataclass: importing dataclasses (and inspect) would add to every rank's start-up, and
    every rank of an srun or mpirun job imports this module."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    nnodes: int = 1
    role: str = ROLE_TRAINER
    mode: str = "collective"              # "collective" | "pserver" | "single"
    current_endpoint: str = ""
    trainer_endpoints: Sequence[str] = ()
    master: str = ""
    pserver_endpoints: Sequence[str] = ()
    pserver_id: int = 0
    sync: bool = True
    selected_gpu: Optional[int] = None    # index into CUDA_VISIBLE_DEVICES, None on CPU
    backend: str = "gloo"
    restart_count: int = 0
    token: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT
    under_mpi: bool = False


def _int(environ: Mapping[str, str], *names: str, default: int) -> int:
    """The first of ``names`` set, as a whole number >= 0; a value that is not one is a
    UsageError naming the variable (one line from the CLI, not int()'s traceback)."""
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            try:
                number = int(value)
            except ValueError:
                number = -1
            if number < 0:
                from fluidctl.errors import UsageError
                raise UsageError(f"environment variable {name}={value!r} is not a whole "
                                 "number >= 0", f"unset {name} or set it to a number, e.g. 0")
            return number
    return default


# --- numeric knobs the runtime reads at import (runtime/wire.py) ---------------------------
# name: (default, whole number, unit): each must be a finite number above 0; nan or inf would
# turn a deadline off (every comparison with nan is false) and 0 or less refuse every frame
KNOBS = {HANDSHAKE_TIMEOUT: (10.0, False, "seconds"), DROP_LOG_INTERVAL: (10.0, False, "seconds"),
         MAX_FRAME: (4 << 30, True, "bytes")}


def _knob(name: str, value: str):
    """(the value of knob ``name``, None) or (None, what it should be)."""
    default, whole, unit = KNOBS[name]
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        number = None
    import math
    if number is None or not math.isfinite(number) or number <= 0:
        return None, f"{'a whole number' if whole else 'a number'} of {unit} above 0"
    return number, None


def _default(name: str) -> str:
    default = KNOBS[name][0]
    return str(default) if isinstance(default, int) else f"{default:g}"


def knob(name: str, environ: Optional[Mapping[str, str]] = None):
    """The knob's value inside a process that cannot refuse to start (a rank, a pserver): a bad
    one is ignored with one line on stderr, and the default used."""
    environ = os.environ if environ is None else environ
    default = KNOBS[name][0]
    value = environ.get(name)
    if value in (None, ""):
        return default
    number, should = _knob(name, value)
    if should:
        import sys
        print(f"fluidctl: ignoring {name}={value!r} (not {should}); using {_default(name)}",
              file=sys.stderr, flush=True)
        return default
    return number


def check_knobs(environ: Mapping[str, str]) -> None:
    """Before a command starts anything: a bad knob in the user's environment is a UsageError
    (one line, exit 2) instead of a warning in every rank's log."""
    for name in KNOBS:
        value = environ.get(name)
        if value not in (None, ""):
            _, should = _knob(name, value)
            if should:
                from fluidctl.errors import UsageError
                raise UsageError(f"{name}={value!r} is not {should}",
                                 f"unset {name} or set one, e.g. {name}={_default(name)}")


def gpu_of_local_rank(environ: Mapping[str, str], local_rank: int) -> int:
    """The CUDA device index (into CUDA_VISIBLE_DEVICES) of a rank started by torchrun or a
    bare mpirun with FLUIDCTL_GPUS: "all" or a count -> its local rank; an id list ("1,3",
    nvidia-smi ids, as --gpus) -> the local rank's id, as an index into CUDA_VISIBLE_DEVICES
    when that is set (else the id itself)."""
    from fluidctl.errors import UsageError
    spec = environ.get(GPUS, "").strip()
    if spec == "all" or spec.isdigit():
        return local_rank
    ids = [g.strip() for g in spec.split(",") if g.strip()]
    if local_rank >= len(ids):
        raise UsageError(f"{GPUS}={spec} names {len(ids)} GPU(s) but this is local rank "
                         f"{local_rank}", f"list one GPU id per rank of the node in {GPUS}")
    wanted = ids[local_rank]
    visible = environ.get(CUDA_VISIBLE_DEVICES)
    if visible is None:
        if not wanted.isdigit():
            raise UsageError(f"{GPUS}={spec}: {wanted!r} is not a GPU id",
                             "give nvidia-smi ids, e.g. FLUIDCTL_GPUS=1,3")
        return int(wanted)
    shown = [v.strip() for v in visible.split(",") if v.strip()]
    if wanted not in shown:
        raise UsageError(f"{GPUS}={spec}: GPU {wanted} is not in "
                         f"{CUDA_VISIBLE_DEVICES}={visible}",
                         f"name GPUs that {CUDA_VISIBLE_DEVICES} shows, or unset it")
    return shown.index(wanted)


def read(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Parse the contract; OpenMPI's variables fill in what PADDLE_* leaves out, and a task of
    a plain ``srun`` step (no contract written by a launcher) is mapped by ``from_slurm``."""
    environ = os.environ if environ is None else environ
    if in_slurm_step(environ) and not any(
            name in environ for name in (TRAINER_ID, TRAINERS_NUM, TORCH_RANK, TRAINING_ROLE)):
        environ = {**environ, **from_slurm(environ)}
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
    if not gpu and environ.get(GPUS):
        # started by torchrun / mpirun with FLUIDCTL_GPUS: one GPU per local rank
        gpu = str(gpu_of_local_rank(environ, _int(environ, LOCAL_RANK, RANK_IN_NODE,
                                                  TORCH_LOCAL_RANK, OMPI_LOCAL_RANK,
                                                  default=0)))
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
              nnodes: int, node_rank: Optional[int] = None, cores: int = 1,
              gpus_on_node: Sequence[str] = ()) -> Dict[str, str]:
    """``fluidctl worker`` under mpirun: OMPI_* plus exchanged endpoints -> the full contract.
    ``gpus_on_node``: the node's GPUs for the job (FLUIDCTL_GPUS), one per local rank."""
    rank = _int(environ, OMPI_RANK, default=0)
    return collective_env(
        gpus_on_node=gpus_on_node, world_device_ids=[gpus_on_node] * nnodes,
        rank=rank, world_size=_int(environ, OMPI_SIZE, default=1),
        local_rank=_int(environ, OMPI_LOCAL_RANK, default=0),
        local_size=_int(environ, OMPI_LOCAL_SIZE, default=1),
        nnodes=nnodes, endpoints=endpoints, master=master, node_rank=node_rank, cores=cores,
        restart_count=_int(environ, RESTART_COUNT, default=0), token=environ.get(JOB_TOKEN))


# --- ssh (read only): where mpirun's daemons, and so their ranks, were reached ---------------
SSH_CONNECTION = "SSH_CONNECTION"   # 'client_ip client_port server_ip server_port' (sshd's)


def ssh_server_address(environ: Mapping[str, str]) -> str:
    """The address this node was reached at when it was entered over ssh (mpirun's daemons
    are), from SSH_CONNECTION, else ''."""
    words = environ.get(SSH_CONNECTION, "").split()
    return words[2] if len(words) == 4 else ""


# --- Slurm (read only) ----------------------------------------------------------------------
# Under plain ``srun`` each task knows its place from these; ``from_slurm`` turns them into the
# whole contract (``fluidctl worker`` and ``fluidctl.runtime.init()`` use it; the Slurm backend
# plans with the same ``slurm_layout`` and ``slurm_ports``).
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_PROCID = "SLURM_PROCID"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_NODEID = "SLURM_NODEID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"   # in an srun step's tasks, not in a batch script
SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
SLURM_DISTRIBUTION = "SLURM_DISTRIBUTION"
SLURM_CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
SLURM_JOB_CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"   # the allocation's CPUs, '2(x3),1'
SLURM_CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"           # salloc -c: what each srun task takes
SLURM_OVERCOMMIT = "SLURM_OVERCOMMIT"                 # srun --overcommit from the environment
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
SLURMD_NODENAME = "SLURMD_NODENAME"             # the task's node, as Slurm names it
SLURM_PORT_LOW, SLURM_PORT_SPAN = 20000, 12000      # derived ports: 20000-31999, below Linux's
#                                                     ephemeral range (32768+)


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


def slurm_ports(job_id: int, step_id: int, local_size: int) -> int:
    """The first of a block of ports derived from the job and step ids: the master port, then
    one per local rank (rank endpoints are base+1+local_rank). Deterministic, so every task
    computes the same ports without talking to the others; the first 4 steps of a job, and
    hundreds of consecutive jobs (12000 / 4 / block size), get disjoint blocks. MASTER_PORT set
    by the user wins for the master."""
    stride = (local_size + 1 + 3) // 4 * 4
    slots = SLURM_PORT_SPAN // stride
    return SLURM_PORT_LOW + ((job_id * 4 + step_id) % slots) * stride


def slurm_pserver_port(job_id: int) -> int:
    """The port of a job's parameter servers under the Slurm backend (one per node):
    32000-32767, from the job id."""
    return 32000 + (job_id * 4) % 768


# what a pserver-mode trainer takes from the collective contract (its place on the node)
NODE_LOCAL_NAMES = (RANK_IN_NODE, LOCAL_RANK, TORCH_LOCAL_RANK, LOCAL_SIZE,
                    TORCH_LOCAL_WORLD_SIZE, NNODES, DS_LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER,
                    TORCH_MASTER_ADDR, TORCH_MASTER_PORT, SELECTED_GPUS, CUDA_VISIBLE_DEVICES,
                    LOCAL_DEVICE_IDS, WORLD_DEVICE_IDS, CUDA_DEVICE_ORDER)


def _endpoint_of(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def slurm_visible_gpus(environ: Mapping[str, str]) -> List[str]:
    """CUDA_VISIBLE_DEVICES as Slurm set it for this task ([] without GPUs)."""
    value = environ.get(CUDA_VISIBLE_DEVICES, "").strip()
    if not value or value == "NoDevFiles":
        return []
    return [g for g in value.split(",") if g]


SLURM_STEP_GPUS = "SLURM_STEP_GPUS"     # the step's GPUs on this node (global ids)
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"   # how many GPUs the job has on this node


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


def from_slurm(environ: Mapping[str, str], cores: Optional[int] = None) -> Dict[str, str]:
    """A task of ``srun``: SLURM_* -> the whole contract, as ``from_ompi`` does under mpirun.

    Ranks, sizes and the node of every rank come from SLURM_PROCID / LOCALID / NODEID /
    NTASKS and the step's node list and tasks per node; MASTER_ADDR is the step's first node
    (never SLURM_LAUNCH_NODE_IPADDR, the host srun ran on); ports from ``slurm_ports`` (or
    MASTER_PORT when set); GPUs are Slurm's binding: CUDA_VISIBLE_DEVICES is kept as Slurm set
    it, and this rank uses the device at index LOCALID (node-wide binding) or 0 (one GPU bound
    per task)."""
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
    base = slurm_ports(job_id, int(step) if step.isdigit() else 0, max(tpn))
    endpoints = [_endpoint_of(nodes[n], base + 1 + local)
                 for n, local in zip(layout.node_of, layout.local_of)]
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
        env[WORLD_DEVICE_IDS] = ",".join(index(local) for local in layout.local_of)
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
