"""Reading the environment contract: what a training process learns from its environment
(``read`` -> ``DistEnv``), OpenMPI's variables mapped onto it (``from_ompi``, for ``fluidctl
worker``), the numeric knobs the runtime reads at import, the job token's file. The names are
``fluidctl.envs.names``'s.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from fluidctl.envs.names import (
    CUDA_VISIBLE_DEVICES, CURRENT_ENDPOINT, DEFAULT_TIMEOUT, DISTRI_BACKEND, DROP_LOG_INTERVAL,
    ENDPOINTS_FILE, NODE_JOIN, NODE_JOIN_RANKS,
    GLOBAL_RANK, GLOBAL_SIZE, GPUS, HANDSHAKE_TIMEOUT, HEARTBEAT_TIMEOUT, JOB_TOKEN, LOCAL_RANK, LOCAL_SIZE, MASTER,
    MAX_FRAME, NNODES, OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE, OMPI_RANK, OMPI_SIZE,
    PSERVERS_IP_PORT_LIST, PSERVER_ID, RANK_IN_NODE, RESTART_COUNT, ROLE, ROLE_PSERVER,
    ROLE_TRAINER, SELECTED_GPUS, SSH_CONNECTION, STRICT_COLLECTIVES, SYNC_MODE, TIMEOUT,
    TORCH_LOCAL_RANK,
    TORCH_LOCAL_WORLD_SIZE, TORCH_MASTER_ADDR, TORCH_MASTER_PORT, TORCH_RANK, TORCH_WORLD_SIZE,
    TRAINERS_NUM, TRAINER_ENDPOINTS, TRAINER_ID, TRAINING_ROLE)
from fluidctl.envs.slurm import from_slurm, in_slurm_step
from fluidctl.envs.write import collective_env, split_endpoint


# how to make a token file, for every error about a missing or empty one
MAKE_TOKEN = ("make one: python -c \"import secrets; print(secrets.token_hex(32))\" > token; "
              "chmod 600 token")


def _read_text(path: str, what: str, fix: str) -> str:
    """The file's text; a UsageError naming ``what`` and ``fix`` if it cannot be read."""
    from fluidctl.errors import UsageError
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}", fix) from None


def read_token_file(path: str) -> str:
    """The job token kept in a file (whitespace stripped); a UsageError if unusable."""
    from fluidctl.errors import UsageError
    token = _read_text(path, "token file", "pass --token-file with a readable file holding "
                       "the job token; " + MAKE_TOKEN).strip()
    if not token:
        raise UsageError(f"token file {path} is empty", MAKE_TOKEN)
    return token


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
    # this node's ranks' endpoints, from ENDPOINTS_FILE, when the world's list was too long for
    # the environment (trainer_endpoints is then empty)
    node_endpoints: Mapping[int, str] = {}
    node_join: str = ""                   # the node agent's join socket (NODE_JOIN), if any
    node_join_ranks: Tuple[int, ...] = ()  # the ranks this process serves the join of, if any

    @property
    def planned_endpoints(self) -> bool:
        """Whether a launcher planned the ranks' endpoints (as a list or a node's file)."""
        return bool(self.trainer_endpoints or self.node_endpoints)

    def endpoint_of(self, rank: int) -> str:
        """``rank``'s planned endpoint where this rank knows it, else ''."""
        if rank < len(self.trainer_endpoints):
            return self.trainer_endpoints[rank]
        return self.node_endpoints.get(rank, "")


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


# --- numeric knobs (the runtime reads some at import: runtime/wire.py) ----------------------
# name: (default, whole number, unit): each must be a finite number above 0; nan or inf would
# turn a deadline off (every comparison with nan is false) and 0 or less refuse every frame
KNOBS = {HANDSHAKE_TIMEOUT: (10.0, False, "seconds"), DROP_LOG_INTERVAL: (10.0, False, "seconds"),
         MAX_FRAME: (4 << 30, True, "bytes"), TIMEOUT: (DEFAULT_TIMEOUT, False, "seconds"),
         HEARTBEAT_TIMEOUT: (3.0, False, "seconds")}


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


def read_endpoints_file(path: str) -> Dict[int, str]:
    """ENDPOINTS_FILE's "<rank> <endpoint>" lines (envs.endpoints_file_text writes them)."""
    from fluidctl.errors import UsageError
    lines = _read_text(path, f"{ENDPOINTS_FILE} file", "start the job with fluidctl train, which "
                       f"writes it on every node, or unset {ENDPOINTS_FILE}").splitlines()
    found: Dict[int, str] = {}
    for line in lines:
        rank, _, endpoint = line.partition(" ")
        if not rank.isdigit() or not endpoint:
            raise UsageError(f"{ENDPOINTS_FILE}={path}: {line[:80]!r} is not '<rank> <endpoint>'",
                             f"unset {ENDPOINTS_FILE}, or start the job with fluidctl train")
        found[int(rank)] = endpoint
    return found


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
    node_endpoints = (read_endpoints_file(environ[ENDPOINTS_FILE])
                      if not endpoints and environ.get(ENDPOINTS_FILE) else {})
    if pservers or role == ROLE_PSERVER:
        mode = "pserver"
    elif world > 1 or endpoints or node_endpoints:
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
        timeout=knob(TIMEOUT, environ),
        under_mpi=under_mpi,
        node_endpoints=node_endpoints,
        node_join=environ.get(NODE_JOIN, ""),
        node_join_ranks=tuple(int(r) for r in environ.get(NODE_JOIN_RANKS, "").split(",")
                              if r.strip().isdigit()),
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


def ssh_server_address(environ: Mapping[str, str]) -> str:
    """The address this node was reached at when it was entered over ssh (mpirun's daemons
    are), from SSH_CONNECTION, else ''."""
    words = environ.get(SSH_CONNECTION, "").split()
    return words[2] if len(words) == 4 else ""


def strict_collectives(environ: Mapping[str, str]) -> bool:
    return environ.get(STRICT_COLLECTIVES, "").strip() == "1"
