"""The two shapes every backend has: a ``Launcher`` (turns a LaunchConfig into a Plan, then
starts that plan's processes) and the ``Handle``s it starts (what the supervisor watches: a
local process, a remote node's agent, mpirun, a Slurm step).

A backend starts, watches and stops processes and moves files; it never decides ranks, ports,
devices or environment: it gathers facts (GPUs, free ports, addresses) and lets
``fluidctl.planning.plan`` decide. Adding a backend is one module with a Launcher class and
one package whose ``Backend`` names it (``fluidctl.backends``)::

    class SlurmLauncher(BaseLauncher):
        name = "slurm"
        def prepare(self, config): ...      # -> Plan (nothing started, nothing written)
        def start(self, plan, attempt): ... # -> [Handle]

``fluidctl.launch.execute`` does the rest for every backend: fresh logs, endpoints.log,
launch.log, the console echo, supervision (fail fast, restarts, signals), the sweep of
leftover processes and the one failure report.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from fluidctl.diagnostics.failures import Failure

if TYPE_CHECKING:
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.planning.config import LaunchConfig
    from fluidctl.planning.plan import Plan


class Handle(Protocol):
    label: str          # "trainer 1", "node n2", "mpirun": names it in logs and reports
    host: str
    log: str            # the log its failure report quotes
    pid: Optional[int]
    service: bool       # a pserver: serves the trainers; its end (even exit 0) fails the job
    # optional, False when absent: True for a handle that a signal only stops following (a
    # submitted Slurm job keeps running): the supervisor then does not say it stops processes
    detaches: bool

    def fileno(self) -> int:
        """A descriptor that becomes readable when the handle may have ended (-1: none, the
        supervisor then polls)."""

    def poll(self) -> Optional[int]:
        """The Popen-style return code once ended, else None (reaps)."""

    def terminate(self) -> None:
        """Ask the whole process tree to stop (SIGTERM)."""

    def kill(self) -> None:
        """Stop the whole process tree now (SIGKILL)."""

    def failure(self) -> Failure:
        """Details of a non-zero end (call after poll() returned non-zero)."""

    def close(self) -> None:
        """Release descriptors once ended."""


class Launcher(Protocol):
    """One backend. Used as: ``plan = prepare(config)``; then (unless --dry-run) for each
    attempt ``start(plan, attempt)``, or ``submit(plan, config)`` once for a launcher that
    ``submits``; always ``close()`` at the end."""
    name: str           # the --backend value
    dry_run_table: bool     # --dry-run prints the plan's table (False: ``describe`` alone)
    submits: bool           # the cluster runs the job: ``submit`` instead of supervision
    request_at: Optional[float]     # after prepare: time.time() to ask for a checkpoint (a
                                    # time limit near), None for none

    def prepare(self, config: "LaunchConfig") -> "Plan":
        """Check what this backend needs (hosts, mpirun, connections), gather the facts the
        planner needs and return ``fluidctl.planning.plan.make_plan(...)``'s Plan
        (``backend`` set to ``name``; ``commands``: what the backend runs itself, for
        --dry-run). A mistake is a ``UsageError``. Nothing is started for the job and nothing
        is written under the log dir (a dry run stops here); held resources (connections,
        reserved ports) are released by ``close``."""

    def start(self, plan: "Plan", attempt: int) -> List[Handle]:
        """Start every process of ``plan`` for attempt ``attempt`` (0 first, then each
        restart; each process's environment gets PADDLE_RESTART_COUNT=attempt) and return one
        Handle per thing to watch. Return only when all started; on an error, stop what this
        call started and raise."""

    def logs(self, plan: "Plan") -> List[str]:
        """The log files of one attempt: emptied when the job starts, a header before each
        restart."""

    def echo_sources(self, plan: "Plan", tee: str, ranks: Optional[Sequence[int]] = None
                     ) -> List[Tuple[str, str]]:
        """[(log path, line prefix)] that the console echo follows for --tee rank0|all|none,
        or for the trainers ``ranks`` (--tee-ranks)."""

    def diagnostics(self, config: "LaunchConfig") -> "Diagnostics":
        """The job's diagnostics (stacks, progress, triage) as this backend gets them."""

    def describe(self, plan: "Plan", show_secrets: bool = False) -> str:
        """Text --dry-run prints after the plan table ("" for none); ``show_secrets``: with
        the job token unmasked (--show-secrets)."""

    def submit(self, plan: "Plan", config: "LaunchConfig") -> int:
        """Hand the plan to the cluster that runs it (a launcher that ``submits``); the
        command's exit code."""

    def relay_checkpoint(self, kind: str) -> None:
        """Pass a running job's checkpoint request (``save``: checkpoint and go on, written
        by ``fluidctl job checkpoint`` into the launcher's request file) on to the ranks that
        do not read that file (a node agent's ranks read their node's own)."""

    @property
    def owns_log_dir(self) -> bool:
        """True when this process runs the job's processes, and so locks the log dir and
        clears stale logs in it; False when it only submits and follows (sbatch)."""

    def close(self) -> None:
        """Release whatever prepare or start still holds (idempotent)."""


def echo_prefix(plan: "Plan", p) -> str:
    """The console prefix of process ``p``'s lines: '[trainer 3] ' on one machine, '[node:3] '
    when the nodes are the hosts the user named (ssh, fabric: logs under LOG_DIR/<host>/)."""
    from fluidctl.planning.plan import PSERVER
    if not plan.job.multi_node_logs:
        return f"[{p.role} {p.rank}] "
    node = plan.job.nodes[p.node].label
    return f"[{node}:{p.rank}] " if p.role != PSERVER else f"[{node}:pserver {p.rank}] "


class RankLog(os.PathLike):
    """Trainer ``rank``'s log in the plan ``current()`` returns now, and its line prefix: an
    elastic job's restart can move a rank to another node (another LOG_DIR/<node>/ file). A
    source whose path changed is read again from the start of the new file (``_Source``
    resolves its path each time it opens it, after half a second without data)."""

    def __init__(self, current: Callable[[], object], rank: int,
                 prefix: Optional[Callable[[object, object], str]] = None):
        self.current, self.rank, self.make_prefix = current, rank, prefix
        self._last = ("", "")
        self._seen = None

    def _now(self) -> Tuple[str, str]:
        plan = self.current()
        if plan is self._seen:
            return self._last
        self._seen = plan
        for p in plan.trainers:
            if p.rank == self.rank:
                self._last = (p.log, self.make_prefix(plan, p) if self.make_prefix else "")
                break
        return self._last           # a rank the new world lacks: its last file, idle

    def __fspath__(self) -> str:
        return self._now()[0]

    @property
    def prefix(self) -> "_Prefix":
        return _Prefix(self)


class _Prefix:
    """A ``RankLog``'s prefix, worked out when a line is written."""

    def __init__(self, log: RankLog):
        self.log = log

    def __format__(self, spec: str) -> str:
        return format(self.log._now()[1], spec)


class BaseLauncher:
    """Defaults for a Launcher: logs and echo come from the plan's processes; ``log`` is
    fluidctl's launch.log (lines are kept until the log dir exists)."""
    name = ""
    dry_run_table = True
    submits = False
    request_at: Optional[float] = None
    request_env: Dict[str, str] = {}    # the checkpoint request's, set by launch/execute.py
    # attempt 0 may start before the supervisor is set up (launch/firststart.py): not where
    # start() emits the job's events (an elastic world), which need its telemetry sink
    starts_first = True

    def __init__(self, log: Optional[Callable[[str], None]] = None):
        self.log: Callable[[str], None] = log or (lambda message: None)

    def prepare(self, config: "LaunchConfig") -> "Plan":
        raise NotImplementedError

    def start(self, plan: "Plan", attempt: int) -> List[Handle]:
        raise NotImplementedError

    def logs(self, plan: "Plan") -> List[str]:
        return [p.log for p in plan.procs]

    def echo_sources(self, plan: "Plan", tee: str, ranks: Optional[Sequence[int]] = None
                     ) -> List[Tuple[str, str]]:
        """Rank 0's log, all (prefixed), none, or the trainers of ``ranks`` (--tee-ranks,
        prefixed). Prefixes: '[trainer 3] ' on one machine, '[node:3] ' when the nodes are
        the hosts the user named (ssh, fabric: logs under LOG_DIR/<host>/)."""
        from fluidctl.planning.plan import PSERVER

        def prefix(p) -> str:
            return echo_prefix(plan, p)
        if ranks is not None:
            return [(p.log, prefix(p)) for p in plan.procs if p.role != PSERVER and p.rank in ranks]
        if tee == "none":
            return []
        if tee == "rank0":
            return [(p.log, "") for p in plan.procs if p.role != PSERVER and p.rank == 0]
        return [(p.log, prefix(p)) for p in plan.procs]

    def diagnostics(self, config: "LaunchConfig") -> "Diagnostics":
        """The job's diagnostics (fluidctl/diagnostics/watch.py): failure triage, --hang-timeout,
        fluidctl dump, failure.json. Kept, so ``start`` can hand ranks its ``env()``."""
        from fluidctl.diagnostics.watch import Diagnostics
        self._diagnostics = Diagnostics.for_job(config)
        return self._diagnostics

    def diag_env(self) -> Dict[str, str]:
        """What the ranks this launcher starts itself need to report to the diagnostics."""
        d = getattr(self, "_diagnostics", None)
        return {**(d.env() if d is not None else {}), **self.request_env}

    def describe(self, plan: "Plan", show_secrets: bool = False) -> str:
        """Text --dry-run prints after the plan (e.g. the batch script Slurm would get)."""
        return ""

    def submit(self, plan: "Plan", config: "LaunchConfig") -> int:
        raise NotImplementedError(f"--backend {self.name} runs its jobs itself (submits is "
                                  "False)")

    def relay_checkpoint(self, kind: str) -> None:
        """Nothing to pass on: the ranks this launcher starts read its request file."""

    @property
    def owns_log_dir(self) -> bool:
        """True when this process runs the job's processes and so locks the log dir (and
        clears stale logs in it); a launcher that only submits and follows (sbatch) does not:
        the job it submitted does."""
        return True

    def close(self) -> None:
        pass
