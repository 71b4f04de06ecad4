"""Planning for Slurm (pure): the Slurm options of ``fluidctl train``, the facts of the
allocation this process runs in, and the Plan of a job that Slurm places.

Slurm decides where each task runs (block distribution over the step's nodes) and each task's
``fluidctl worker`` derives its whole contract from SLURM_* (``fluidctl.envs.from_slurm``). So,
as for mpirun, a process's ``env`` in the plan is what srun exports to every task; the rank,
node and log of each process are what Slurm and the worker will give it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from fluidctl import envs
from fluidctl.errors import UsageError
from fluidctl.paths import LogLayout
from fluidctl.sigs import GRACE_PERIOD
from fluidctl.planning.devices import gpu_request


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm-only options of ``fluidctl train`` (declared in commands/slurm_options.py,
    gathered by launch/train.py)."""
    nodes: Optional[int] = None
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    slurm_args: Tuple[str, ...] = ()
    detach: bool = False
    job_name: Optional[str] = None
    checkpoint_warning: Optional[int] = None    # seconds before --time ends: a request


@dataclass(frozen=True)
class Allocation:
    """The allocation this process runs in (from the variables salloc/sbatch set)."""
    job_id: str
    nodes: Tuple[str, ...]
    tasks_per_node: Optional[int] = None
    gpus_per_node: int = 0


def allocation(environ: Mapping[str, str]) -> Optional[Allocation]:
    """The allocation SLURM_JOB_ID names, or None outside one."""
    job_id = environ.get(envs.SLURM_JOB_ID) or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    nodes = envs.expand_nodelist(environ.get(envs.SLURM_JOB_NODELIST)
                                 or environ.get("SLURM_NODELIST", ""))
    tpn = environ.get("SLURM_NTASKS_PER_NODE", "")
    gpus = environ.get("SLURM_GPUS_ON_NODE", "") or environ.get("SLURM_GPUS_PER_NODE", "")
    gpus = gpus.rpartition(":")[2]          # --gpus-per-node a100:4 is 'a100:4' there
    return Allocation(job_id, tuple(nodes), int(tpn) if tpn.isdigit() else None,
                      int(gpus) if gpus.isdigit() else 0)


def ranks_per_node(nproc: Optional[int], gpus: Optional[str],
                   alloc: Optional[Allocation]) -> int:
    """--gpus (a count, or ids: one rank per id), else --nproc, else what the allocation
    asked for per node (tasks, else GPUs), else 1."""
    if gpus is not None:
        count, _ = gpu_request(gpus)
        if count <= 0:
            raise UsageError(f"--gpus {gpus} selects no GPU", "give a count or ids, e.g. --gpus 4")
        if nproc is not None and nproc != count:
            raise UsageError(f"--nproc {nproc} and --gpus {gpus} disagree",
                             "give only one of them: --gpus starts one rank per GPU")
        return count
    if nproc:
        return nproc
    if alloc is not None:
        return alloc.tasks_per_node or alloc.gpus_per_node or 1
    return 1


def job_nodes(options: SlurmOptions, alloc: Optional[Allocation]) -> List[str]:
    """The nodes the job runs on: the first --nodes of the allocation (all by default); outside
    an allocation Slurm has not chosen them yet, so they are named node0, node1, ..."""
    if alloc is None:
        if options.nodes is None:
            raise UsageError("not in a Slurm allocation and no --nodes given",
                             "pass --nodes N to submit the job with sbatch, or run inside "
                             "salloc or a batch script")
        return [f"node{i}" for i in range(options.nodes)]
    count = options.nodes or len(alloc.nodes)
    if count > len(alloc.nodes):
        raise UsageError(f"--nodes {count} but allocation {alloc.job_id} has "
                         f"{len(alloc.nodes)} node(s)",
                         f"pass --nodes {len(alloc.nodes)} or less, or allocate more nodes")
    return list(alloc.nodes[:count])


def check_cpus(alloc: Allocation, nodes: Sequence[str], per_node: int,
               environ: Mapping[str, str], slurm_args: Sequence[str] = ()) -> None:
    """Inside an allocation: the step's ``per_node`` tasks, each taking SLURM_CPUS_PER_TASK
    CPUs (1 by default), fit every node's CPUs (SLURM_JOB_CPUS_PER_NODE). srun would refuse
    the step anyway ('More processors requested than permitted'); here it is one line with
    the numbers, before anything starts. Not checked where the user lets srun overcommit
    (SLURM_OVERCOMMIT) or passes srun options of their own, nor without the variable."""
    spec = environ.get(envs.SLURM_JOB_CPUS_PER_NODE, "")
    if not spec or environ.get(envs.SLURM_OVERCOMMIT) or slurm_args:
        return
    try:
        cpus = envs.parse_tasks_per_node(spec)
    except UsageError:
        return
    per_task = environ.get(envs.SLURM_CPUS_PER_TASK, "1")
    per_task = int(per_task) if per_task.isdigit() and int(per_task) > 0 else 1
    need = per_node * per_task
    for node, have in zip(nodes, cpus):
        if need > have:
            fits = have // per_task
            each = f" of {per_task} CPU(s) each" if per_task > 1 else ""
            raise UsageError(
                f"{per_node} rank(s) per node{each} need {need} CPU(s), but allocation "
                f"{alloc.job_id} has {have} on {node} ({envs.SLURM_JOB_CPUS_PER_NODE}={spec})",
                f"run at most {fits} per node (--nproc {fits}), or allocate more CPUs, e.g. "
                f"salloc -N {len(nodes)} --ntasks-per-node {per_node}")


# what salloc/sbatch set when the allocation has GPUs (--gpus-per-node, --gpus, --gres)
GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS",
                 "SLURM_STEP_GPUS", "SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_NODE",
                 "SLURM_TRES_PER_TASK", "SLURM_JOB_GRES")
# the sbatch options that decide which job is made: inside an allocation there is none to make
JOB_ONLY_OPTIONS = ("partition", "time", "account", "qos", "constraint", "exclude", "job_name")


def check_step_options(alloc: Allocation, options: SlurmOptions) -> None:
    """Inside an allocation fluidctl runs a step of a job that already exists: --partition,
    --time, --account, --qos, --constraint, --exclude and --job-name, which choose the job,
    cannot apply, and are refused rather than ignored."""
    given = [name for name in JOB_ONLY_OPTIONS if getattr(options, name)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag} {getattr(options, given[0])} applies to a new job, but this "
                         f"runs inside allocation {alloc.job_id}",
                         f"drop {flag} here (step options go in --slurm-arg), or submit a new "
                         "job with --detach or from outside the allocation")


def check_gpus(alloc: Allocation, gpus: Optional[str], environ: Mapping[str, str] = {},
               slurm_args: Sequence[str] = ()) -> None:
    """Inside an allocation that has GPUs (SLURM_GPUS_ON_NODE): ``--gpus`` asks for no more
    per node than it has, and names no GPU past the last. Otherwise the extra ranks would
    start and fail one by one on a device that is not there. In an allocation without any
    GPU (none of GPU_VARIABLES, no --slurm-arg asking for one), ``--gpus`` is refused: the
    ranks would train on CPU and end with 0."""
    have = alloc.gpus_per_node
    if gpus is None:
        return
    if not have and not any("gpu" in environ.get(name, "").lower() or
                            (name != "SLURM_TRES_PER_NODE" and environ.get(name, "").strip())
                            for name in GPU_VARIABLES) \
            and not any("gpu" in arg or "gres" in arg for arg in slurm_args):
        count, _ = gpu_request(gpus)
        raise UsageError(f"--gpus {gpus} but allocation {alloc.job_id} has no GPUs (Slurm set "
                         "none of SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, SLURM_GPUS_PER_NODE)",
                         f"allocate some, e.g. salloc --gpus-per-node {count}, or run on CPU "
                         f"with --nproc {count}")
    if not have:
        return
    count, ids = gpu_request(gpus)
    where = f"allocation {alloc.job_id} has {have} GPU(s) on each node"
    if count > have:
        raise UsageError(f"--gpus {gpus} asks for {count} GPU(s) per node, but {where}",
                         f"pass --gpus {have} or less, or allocate more, e.g. salloc "
                         f"--gpus-per-node {count}")
    if ids is not None:
        past = [g for g in ids if not g.isdigit() or int(g) >= have]
        if past:
            raise UsageError(f"--gpus {gpus} names GPU {past[0]}, but {where}: they are "
                             f"0-{have - 1} there", f"pick ids from 0 to {have - 1}")


def pserver_count(mode: str, pservers: Optional[int], nodes: int) -> int:
    """Parameter servers: one on each of the first --pservers nodes (default 1)."""
    if mode != "pserver":
        return 0
    count = pservers or 1
    if count > nodes:
        raise UsageError(f"--pservers {count} but the job runs on {nodes} node(s)",
                         "run at most one pserver per node under Slurm")
    return count


def pserver_endpoints(job_id: str, nodes: Sequence[str], count: int) -> List[str]:
    port = envs.slurm_pserver_port(int(job_id))
    return [f"{node}:{port}" for node in nodes[:count]]


def step_env(*, log_dir: Path, token: str, user_env: Mapping[str, str]) -> dict:
    """What every task of the job's steps gets from srun beside SLURM_*: the user's additions,
    the log dir, the job token (never on a command line), and no echo from the workers (each
    writes its workerlog.N; nothing is forwarded through srun)."""
    env = dict(user_env)
    env.update({envs.LOG_DIR: str(log_dir.resolve()), envs.JOB_TOKEN: token,
                envs.WORKER_ECHO: "0", envs.RESTART_COUNT: "0"})
    return env


def inner_train_argv(config, log_dir: Path) -> List[str]:
    """What the batch script runs: this same job inside its allocation. Paths are absolute
    (the job may start elsewhere); the batch output gets fluidctl's own messages and the
    failure report, the ranks' output stays in workerlog.N (--tee none). --slurm-arg values
    became #SBATCH lines and are not repeated for the srun step; restarts are fluidctl's on the
    login node (each one a new submission), so --max-restarts is not repeated either."""
    argv = [config.interpreter, "-m", "fluidctl", "train", "--backend", "slurm",
            "--log-dir", str(log_dir), "--tee", "none"]
    if config.gpus is not None:
        argv += ["--gpus", config.gpus]
    elif config.nproc is not None:
        argv += ["--nproc", str(config.nproc)]
    if config.mode != "collective":
        argv += ["--mode", config.mode]
    if config.pservers:
        argv += ["--pservers", str(config.pservers)]
    if not config.sync:
        argv.append("--async")
    pserver_args = list(config.pserver_args)
    for flag in ("--checkpoint-dir", "--checkpoint-every"):
        if flag in pserver_args:
            argv += [flag, pserver_args[pserver_args.index(flag) + 1]]
    for name, value in sorted(config.user_env.items()):
        argv += ["--env", f"{name}={value}"]
    if config.grace_period != GRACE_PERIOD:
        argv += ["--grace-period", f"{config.grace_period:g}"]
    if config.checkpoint_signal != "TERM":
        argv += ["--checkpoint-signal", config.checkpoint_signal]
    if config.log_tail != 20:
        argv += ["--log-tail", str(config.log_tail)]
    if config.hang_timeout:
        argv += ["--hang-timeout", f"{config.hang_timeout:g}"]
    if config.include_bad:
        argv.append("--include-bad")
    if config.metrics_port is not None:         # served by the batch job's own launcher
        argv += ["--metrics-port", str(config.metrics_port),
                 "--metrics-host", config.metrics_host]
    script = config.script
    if script.endswith(".py") or os.sep in script:
        script = os.path.abspath(script)
    return argv + [script, *config.script_args]


def plan_slurm(job, nodes: Sequence[str], ntasks_per_node: int, pservers: int,
               rank_argv: Sequence[str], pserver_argv: Sequence[str], env: Mapping[str, str],
               pserver_eps: Sequence[str] = (), commands=()):
    """The Plan of a Slurm job: ``ntasks_per_node`` trainers on each node in block order (what
    srun does), pservers on the first nodes; ``env`` is what srun exports (the worker derives
    the rest of the contract from SLURM_*), so endpoints and master are left to the ranks."""
    from fluidctl.planning.plan import PSERVER, TRAINER, Plan, ProcSpec
    layout = LogLayout(Path(job.log_dir))
    procs = []
    for index in range(pservers):
        procs.append(ProcSpec(PSERVER, index, 0, index, nodes[index], pserver_eps[index], [],
                              list(pserver_argv), dict(env), str(layout.server(index))))
    placement = envs.slurm_layout(list(nodes), [ntasks_per_node] * len(nodes))
    for rank, (node, local) in enumerate(zip(placement.node_of, placement.local_of)):
        procs.append(ProcSpec(TRAINER, rank, local, node, nodes[node], "", [], list(rank_argv),
                              dict(env), str(layout.worker(rank))))
    return Plan(job, procs, "", [], list(pserver_eps), "slurm", list(commands))


def configure(config, values: dict):
    """``config`` with its ``SlurmOptions``; the allocation, not a hostfile, gives the nodes."""
    from fluidctl.planning.elastic import node_count
    nodes = node_count(values.pop("nodes", None), "slurm")
    if config.gpus == "all":
        raise UsageError("--gpus all is not known with --backend slurm",
                         "give a count per node, e.g. --gpus 4")
    if values.get("health_gate"):
        raise UsageError("--health-gate measures the nodes of --hostfile/--hosts over SSH; "
                         "under Slurm the allocation chooses them",
                         "drop --health-gate (run fluidctl cluster check --deep on the "
                         "allocation's nodes), or pass --exclude")
    from fluidctl.planning.nodeopts import refuse_without_nodes
    refuse_without_nodes(config, bool(values.get("include_bad")),   # the allocation's ledger
                         "under Slurm srun starts the ranks on the allocation's nodes",
                         keep=("--include-bad",))
    if config.started_port:
        raise UsageError("--started-port: under Slurm the ranks choose their endpoints when "
                         "they start", "drop --started-port")
    options = SlurmOptions(
        nodes=nodes, partition=values.pop("partition", None), time=values.pop("time_limit", None),
        account=values.pop("account", None), qos=values.pop("qos", None),
        constraint=values.pop("constraint", None), exclude=values.pop("exclude", None),
        slurm_args=tuple(values.pop("slurm_args", None) or ()),
        detach=bool(values.pop("detach", False)), job_name=values.pop("job_name", None),
        checkpoint_warning=values.pop("checkpoint_warning", None))
    return replace(config, backend_options=options)
