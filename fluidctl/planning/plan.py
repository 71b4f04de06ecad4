"""Planning: which process runs where, with which rank, endpoint, devices and environment.

Pure: ``make_plan(job, ports)`` does no I/O, so every rank's environment can be unit-tested and
shown by ``--dry-run`` without starting anything. Backends only start what the plan says: they
gather facts (a node's GPUs, free ports, the address it was reached at) and hand them to the
functions here, which decide (``local_node``, ``remote_node``, ``pserver_counts``, ``ports_to_probe``,
``node_ports``, ``place_ranks``, ``make_plan``).

``Plan.to_json()`` is what ``fluidctl train --dry-run --json`` prints, the same schema for
every backend (see docs/architecture.md, "The plan as JSON").
"""
from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from fluidctl import envs
from fluidctl.errors import UsageError
from fluidctl.paths import LogLayout
from fluidctl.planning import devices
from fluidctl.planning.devices import physical_gpu

TRAINER = "trainer"
PSERVER = "pserver"
MAX_UNKNOWN_PORTS = 33      # ports probed when the node's process count depends on its GPUs


@dataclass(frozen=True)
class Node:
    """One machine of the job: the address ranks use to reach it and its processes."""
    address: str                       # what endpoints say (the resolved HostName for SSH)
    nproc: int                         # trainer processes on this node
    gpus: Tuple[str, ...] = ()         # physical GPU ids, one per trainer when not empty
    name: str = ""                     # how the user named it (hostfile entry); for log dirs
    pservers: int = 0                  # parameter servers placed on this node

    @property
    def label(self) -> str:
        return self.name or self.address


@dataclass
class JobSpec:
    script: str
    script_args: Sequence[str] = ()
    nodes: Sequence[Node] = (Node("127.0.0.1", 1),)
    mode: str = "collective"            # "collective" | "pserver"
    pserver_endpoints: Sequence[str] = ()   # pservers already running (not started by us)
    sync: bool = True
    pserver_args: Sequence[str] = ()    # extra flags for `python -m fluidctl.runtime.pserver`
    log_dir: str = "mylog"
    user_env: Mapping[str, str] = field(default_factory=dict)
    python: str = sys.executable
    cores: int = os.cpu_count() or 1
    token: Optional[str] = None
    multi_node_logs: bool = False       # remote nodes: logs under LOG_DIR/<host>/

    def ports_needed(self, node_index: int) -> int:
        """Trainer endpoints on the node, its pservers, and the master port on node 0."""
        node = self.nodes[node_index]
        return node.nproc + node.pservers + (1 if node_index == 0 else 0)


@dataclass
class ProcSpec:
    role: str                 # TRAINER | PSERVER
    rank: int                 # global trainer rank, or pserver index
    local_rank: int
    node: int                 # index into JobSpec.nodes
    host: str
    endpoint: str
    devices: List[str]
    argv: List[str]
    env: Dict[str, str]       # the contract only; the backend adds the inherited environment
    log: str

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class LaunchCommand:
    """A process the backend itself runs to start the job's processes (a node agent, mpirun)."""
    host: str
    argv: List[str]
    cwd: str = ""               # where it runs on the node ("": not set by the plan)

    def to_json(self) -> dict:
        record = asdict(self)
        if not self.cwd:
            del record["cwd"]
        return record


@dataclass
class Plan:
    job: JobSpec
    procs: List[ProcSpec]
    master: str                 # "" when the ranks choose it at start (mpi)
    trainer_endpoints: List[str]
    pserver_endpoints: List[str]
    backend: str = "local"
    commands: List[LaunchCommand] = field(default_factory=list)

    def write_endpoints(self, layout) -> None:
        """LOG_DIR/endpoints.log (a ``paths.LogLayout``'s): the master and every process's
        role, rank, host and endpoint; written again when an elastic restart makes a new
        world."""
        from fluidctl.paths import write_atomic
        lines = [f"master {self.master}"]
        lines += [f"{p.role} {p.rank} {p.host} {p.endpoint}" for p in self.procs]
        write_atomic(layout.endpoints, "\n".join(lines) + "\n")

    @property
    def trainers(self) -> List[ProcSpec]:
        return [p for p in self.procs if p.role == TRAINER]

    def on_node(self, index: int) -> List[ProcSpec]:
        return [p for p in self.procs if p.node == index]

    def to_json(self) -> dict:
        return {"backend": self.backend, "mode": self.job.mode, "master": self.master,
                "trainer_endpoints": self.trainer_endpoints,
                "pserver_endpoints": self.pserver_endpoints,
                "nodes": [asdict(n) for n in self.job.nodes],
                "procs": [p.to_json() for p in self.procs],
                "commands": [c.to_json() for c in self.commands]}


def script_argv(script: str, args: Sequence[str], python: str) -> List[str]:
    """``.py`` runs with fluidctl's own interpreter, unbuffered; anything else is executed."""
    if script.endswith(".py"):
        return [python, "-u", script, *args]
    return [script, *args]


def pserver_argv(job: JobSpec) -> List[str]:
    return [job.python, "-u", "-m", "fluidctl.runtime.pserver", *job.pserver_args]


def place_ranks(trainers_per_node: Sequence[int]) -> List[List[int]]:
    """The global trainer ranks of each node: node 0 takes 0..n0-1, node 1 the next n1, ...
    (``fluidctl shard-data --to-hosts`` sends shard i where this puts trainer i)."""
    placed, rank = [], 0
    for count in trainers_per_node:
        placed.append(list(range(rank, rank + count)))
        rank += count
    return placed


def node_gpus(nproc: Optional[int], gpus: Optional[str], available: Sequence[str]) -> List[str]:
    """The GPUs a node's processes use: --gpus resolved against what the node has; with neither
    --gpus nor --nproc, all of them; with --nproc alone, none (CPU processes)."""
    if gpus is not None or nproc is None:
        found = devices.select_gpus(gpus, list(available)) if gpus is not None else list(available)
    else:
        found = []
    if gpus is not None and nproc is not None and nproc != len(found):
        raise UsageError(f"--nproc {nproc} and --gpus {gpus} ({len(found)} GPUs) disagree",
                         "give only one of them: --gpus starts one process per GPU")
    return found


def wants_gpus(nproc: Optional[int], gpus: Optional[str]) -> bool:
    """Whether the node's GPUs matter (so a launcher looks them up): --gpus, or no --nproc."""
    return gpus is not None or nproc is None


def local_node(nproc: Optional[int], gpus: Optional[str], mode: str, pservers: Optional[int],
               pserver_endpoints: Sequence[str], available: Sequence[str]) -> Node:
    """This machine as the job's one node, given the GPUs it has (``available``)."""
    found = node_gpus(nproc, gpus, available)
    count = len(found) if found else (nproc or 1)
    if mode != "pserver":
        return Node("127.0.0.1", count, tuple(found))
    return Node("127.0.0.1", count, tuple(found),
                pservers=0 if pserver_endpoints else (pservers or 1))


def remote_node(name: str, address: str, slots: Optional[int], nproc: Optional[int],
                gpus: Optional[str], gpu_ids: Sequence[str], pservers: int) -> Node:
    """One node of a multi-node job: its hostfile slots (None when not given), the address it
    was reached at and the GPUs its agent found (ids as CUDA_VISIBLE_DEVICES names them there:
    a node whose CUDA_VISIBLE_DEVICES is 2,3 runs on 2 and 3, not 0 and 1)."""
    found = node_gpus(nproc, gpus, list(gpu_ids))
    count = slots if slots is not None else (len(found) if found else (nproc or 1))
    if found and len(found) != count:
        raise UsageError(f"node {name} has {count} slots but {len(found)} GPUs selected",
                         "make slots match the GPUs, or drop slots= and use --gpus")
    return Node(address, count, tuple(found), name, pservers)


def pserver_counts(mode: str, pserver_endpoints: Sequence[str], pservers: Optional[int],
                   pserver_hosts: Sequence[str], names: Sequence[str]) -> List[int]:
    """How many pservers each node runs: round robin over the nodes (or --pserver-hosts)."""
    counts = [0] * len(names)
    if mode != "pserver" or pserver_endpoints:
        return counts
    chosen = list(pserver_hosts) or list(names)
    unknown = [h for h in chosen if h not in names]
    if unknown:
        raise UsageError(f"--pserver-hosts names {','.join(unknown)}, not in the hosts",
                         f"choose from {','.join(names)}")
    for i in range(pservers or 1):
        counts[list(names).index(chosen[i % len(chosen)])] += 1
    return counts


def ports_to_probe(slots: Optional[int], nproc: Optional[int], pservers: int) -> int:
    """Free ports a node's agent looks for before the plan exists: its trainers (up to
    MAX_UNKNOWN_PORTS when they depend on its GPUs), its pservers, and a master port."""
    count = slots if slots is not None else nproc
    return (count or MAX_UNKNOWN_PORTS) + pservers + 1


def node_ports(needed: int, started_port: Optional[int], probed: Sequence[int]) -> List[int]:
    """A node's ports: --started-port P, P+1, ... or the free ones its agent found."""
    if started_port:
        return list(range(started_port, started_port + needed))
    return list(probed[:needed])


def relative_script(script: str, cwd: str) -> str:
    """A script inside the working directory is named relative to it, so it is found under
    --remote-dir on the nodes; others keep their absolute path. A program (not ``.py``) gets
    ``./``, as a shell needs: a bare ``hi.sh`` would be looked up on the node's PATH."""
    absolute = os.path.abspath(script)
    rel = os.path.relpath(absolute, cwd)
    if rel.startswith(".."):
        return absolute
    return rel if script.endswith(".py") else "./" + rel


def make_plan(job: JobSpec, ports: Mapping[int, Sequence[int]], backend: str = "local",
              commands: Sequence[LaunchCommand] = ()) -> Plan:
    """Lay the job out. ``ports[i]`` are the ports reserved on node i (``job.ports_needed(i)``
    of them): trainers first, then pservers, then (node 0) the master's. ``backend`` and
    ``commands`` (what that backend runs itself) are recorded for --dry-run."""
    layout = LogLayout(Path(job.log_dir))
    trainer_eps: List[str] = []
    pserver_eps: List[str] = list(job.pserver_endpoints)
    placed = []  # (node index, local rank) for trainers, in rank order
    pserver_slots = []  # node index of each pserver
    for i, (node, ranks) in enumerate(zip(job.nodes, place_ranks([n.nproc for n in job.nodes]))):
        node_ports = list(ports[i])
        for local in range(len(ranks)):
            trainer_eps.append(f"{node.address}:{node_ports[local]}")
            placed.append((i, local))
        if not job.pserver_endpoints:
            for k in range(node.pservers):
                port = node_ports[node.nproc + k]
                pserver_eps.append(f"{node.address}:{port}")
                pserver_slots.append(i)
    master = f"{job.nodes[0].address}:{list(ports[0])[-1]}"
    world = len(trainer_eps)
    world_devices = [list(n.gpus) for n in job.nodes]
    world_strings = envs.world_strings(trainer_eps, world_devices if any(world_devices) else ())
    if job.mode != "pserver":            # NCCL: one rank per physical GPU (MIG siblings too)
        for node in job.nodes:
            envs.refuse_shared_gpus(f"node {node.label}", node.gpus,
                                    [physical_gpu(g) for g in node.gpus],
                                    job.user_env, os.environ)

    def log_path(role: str, index: int, node: int) -> str:
        lay = layout.for_host(job.nodes[node].label) if job.multi_node_logs else layout
        return str(lay.for_role(role, index))

    procs: List[ProcSpec] = []
    for index, node_index in enumerate(pserver_slots):
        node = job.nodes[node_index]
        env = envs.pserver_env(
            role=envs.ROLE_PSERVER, index=index, trainers=world, pserver_endpoints=pserver_eps,
            trainer_endpoints=trainer_eps, sync=job.sync, use_gpu=bool(node.gpus),
            cores=job.cores, procs_on_node=node.nproc + node.pservers,
            user_env=job.user_env, token=job.token, world=world_strings)
        procs.append(ProcSpec(PSERVER, index, index, node_index, node.address, pserver_eps[index],
                              [], pserver_argv(job), env, log_path(PSERVER, index, node_index)))
    for rank, (node_index, local) in enumerate(placed):
        node = job.nodes[node_index]
        devices = [node.gpus[local]] if node.gpus else []
        if job.mode == "pserver":
            env = envs.pserver_env(
                role=envs.ROLE_TRAINER, index=rank, trainers=world,
                pserver_endpoints=pserver_eps, trainer_endpoints=trainer_eps, sync=job.sync,
                use_gpu=bool(node.gpus), cores=job.cores,
                procs_on_node=node.nproc + node.pservers, user_env=job.user_env,
                token=job.token, world=world_strings)
            env.update(_local_names(local, node.nproc, node_index, len(job.nodes), master,
                                    node.gpus, world_devices, world_strings))
        else:
            env = envs.collective_env(
                rank=rank, world_size=world, local_rank=local, local_size=node.nproc,
                nnodes=len(job.nodes), endpoints=trainer_eps, master=master,
                node_rank=node_index, gpus_on_node=node.gpus, world_device_ids=world_devices,
                cores=job.cores, user_env=job.user_env, token=job.token, world=world_strings)
        procs.append(ProcSpec(TRAINER, rank, local, node_index, node.address, trainer_eps[rank],
                              devices, script_argv(job.script, job.script_args, job.python),
                              env, log_path(TRAINER, rank, node_index)))
    return Plan(job, procs, master, trainer_eps, pserver_eps, backend, list(commands))


def mpi_nodes(hosts: Sequence, nproc: Optional[int]) -> List[Node]:
    """The nodes of an mpirun job: each host's slots= (else --nproc, else 1); without hosts,
    this machine with --nproc ranks."""
    if not hosts:
        return [Node("127.0.0.1", nproc or 1)]
    return [Node(h.address, h.slots if h.slots_given else (nproc or 1), (), h.name)
            for h in hosts]


def plan_mpi(job: JobSpec, rank_argv: Sequence[str], backend: str = "mpi",
             commands: Sequence[LaunchCommand] = ()) -> Plan:
    """An mpirun job: ranks laid out over the nodes by slot (what ``--map-by slot`` does), each
    running ``rank_argv`` (``fluidctl worker SCRIPT``). The ranks pick their endpoints when
    they start and learn each other's through MPI, so endpoints and master are empty here;
    ``env`` is what mpirun exports to every rank (the worker adds the rest of the contract)."""
    if job.mode != "collective":
        raise UsageError("--backend mpi runs collective jobs only",
                         "use --backend ssh for --mode pserver across nodes")
    layout = LogLayout(Path(job.log_dir))
    env = dict(job.user_env)
    env[envs.LOG_DIR] = str(layout.root.resolve())
    env[envs.JOB_TOKEN] = job.token or ""
    env[envs.RESTART_COUNT] = "0"
    procs = []
    for i, (node, ranks) in enumerate(zip(job.nodes, place_ranks([n.nproc for n in job.nodes]))):
        for local, rank in enumerate(ranks):
            procs.append(ProcSpec(TRAINER, rank, local, i, node.address, "", [],
                                  list(rank_argv), dict(env), str(layout.worker(rank))))
    return Plan(job, procs, "", [], [], backend, list(commands))


def _local_names(local: int, local_size: int, node_rank: int, nnodes: int, master: str, gpus,
                 world_devices, world=None) -> Dict[str, str]:
    """Node-local names a pserver-mode trainer also gets (local rank, master, devices)."""
    full = envs.collective_env(rank=0, world_size=1, local_rank=local, local_size=local_size,
                               nnodes=nnodes, endpoints=["-"], master=master,
                               node_rank=node_rank, gpus_on_node=gpus,
                               world_device_ids=world_devices, world=world)
    return {k: v for k, v in full.items() if k in envs.NODE_LOCAL_NAMES}


def with_restart(env: Mapping[str, str], attempt: int) -> Dict[str, str]:
    """The environment of a restarted attempt: the same contract, a new PADDLE_RESTART_COUNT
    (and torch's TORCHELASTIC_RESTART_COUNT where the contract has it: collective mode)."""
    out = dict(env)
    out[envs.RESTART_COUNT] = str(attempt)
    if envs.TORCH_RESTART_COUNT in out:
        out[envs.TORCH_RESTART_COUNT] = str(attempt)
    return out
