"""Slurm as a backend: ``fluidctl train --backend slurm`` (``SlurmLauncher``).

Inside an allocation (SLURM_JOB_ID set: under salloc, or in a batch script) the job is ONE
``srun`` step over the allocation's nodes, each task ``fluidctl worker SCRIPT``, which maps
SLURM_* to the contract (``envs.from_slurm``) and writes LOG_DIR/workerlog.N. The step runs
with ``--kill-on-bad-exit=1``: when a rank fails, Slurm ends the whole step (fail fast, no
rank left waiting on a dead peer); srun's own report (LOG_DIR/srun.log) names the first task
that failed, its node and its exit code, and that is what fluidctl reports and exits with.
Ctrl-C and SIGTERM stop srun, which cancels the step on every node; a step that outlives a
killed srun is cancelled with scancel. In pserver mode a second step (``--overlap``) runs one
parameter server on each of the first ``--pservers`` nodes, a service of the trainers' step.

Outside an allocation the job is submitted: a batch script kept as LOG_DIR/slurm-JOBID.sbatch
(checked with ``sbatch --test-only`` while planning, shown by ``--dry-run``) whose body is this
same command inside the allocation, then ``sbatch --parsable``, a record under fluidctl's state
dir, and the job is followed as one handle until it ends; Ctrl-C detaches, ``--detach``
returns at once. ``slurmctl.py`` has the batch script, records and job states; ``step.py`` the
srun step and what srun's report says.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import List, Optional

from fluidctl import envs
from fluidctl.backends.slurm import slurmctl
from fluidctl.backends.base import BaseLauncher
from fluidctl.errors import UsageError
from fluidctl.diagnostics.failures import Failure, FailureKind, describe_exit
from fluidctl.paths import LogLayout
from fluidctl.backends.slurm import plan as slurmplan
from fluidctl.backends.slurm.step import (SrunStep, first_failed_task, job_end, node_failure,
                                         srun_argv, srun_failure, step_name, worker_command)


# --- outside an allocation: the submitted job as one handle ---------------------------------
class SubmittedJob:
    """A batch job, watched from the login node: ``poll`` asks Slurm (at most every POLL
    seconds) and prints each change of state; ``terminate``/``kill`` (Ctrl-C, SIGTERM) detach,
    leaving the job running; a failure is the failing rank's, from the srun.log the job's own
    fluidctl wrote."""
    service = False
    detaches = True         # a signal stops the following, never the job

    def __init__(self, record: slurmctl.JobRecord, detached: bool = False):
        self.record, self.layout = record, record.run_layout
        self.label, self.host, self.pid = f"slurm job {record.job_id}", "slurm", None
        self.log = str(record.layout.slurm_output_of(record.job_id))
        self._code: Optional[int] = 0 if detached else None
        self._state: Optional[slurmctl.JobState] = None
        self._last_poll = 0.0

    def fileno(self) -> int:
        return -1

    def _say(self, text: str) -> None:
        print(f"fluidctl: {text}", file=sys.stderr, flush=True)

    def poll(self) -> Optional[int]:
        if self._code is not None:
            return self._code
        if time.monotonic() - self._last_poll < slurmctl.POLL:
            return None
        self._last_poll = time.monotonic()
        st = slurmctl.state(self.record)
        if self._state is None or st.state != self._state.state:
            if not st.done:
                where = f" on {st.nodes}" if st.nodes and st.state == "RUNNING" else ""
                why = f" ({st.reason})" if st.reason else ""
                self._say(f"job {self.record.job_id} {st.state}{why}{where}")
        self._state = st
        if st.done:
            self._code = st.exit_code if st.exit_code is not None else 1
            slurmctl.record_end(self.record, st)
            if st.state == "CANCELLED":
                self._say(f"job {self.record.job_id} was cancelled (scancel or 'fluidctl job "
                          f"cancel'), exit code {self._code}: not restarted")
            else:
                self._say(f"job {self.record.job_id} {st.state}, exit code {self._code}")
        return self._code

    def terminate(self) -> None:
        if self._code is None:
            self._code = 128 + signal.SIGINT
            self._say(slurmctl.stopped_following(self.record.job_id))

    kill = terminate

    def failure(self) -> Failure:
        from fluidctl.diagnostics.watch import HANG_EXIT
        if self._code == HANG_EXIT:         # the job's own fluidctl found it hung (its report)
            return Failure(self.label, self.host, HANG_EXIT, self.log,
                           detail=_hang_detail(self.layout), kind=FailureKind.HANG)
        if self._state is not None and self._state.state == "CANCELLED":
            # not a failure of the job's own: a cancel ends the follower, never restarts it
            return Failure(self.label, self.host, self._code or 1, self.log,
                           detail=f"cancelled (scancel or 'fluidctl job cancel'), exit code "
                                  f"{self._code}", kind=FailureKind.CANCELLED)
        state = self._state.state if self._state else "UNKNOWN"
        return submitted_failure(self.record, state, self._code)

    def close(self) -> None:
        pass


class _JobLogPath(os.PathLike):
    """A log of the submitted job, by name in its own directory: resolved each time it is
    used, so the console echo opens it once sbatch has named the job (and the next job's
    after a restart)."""

    def __init__(self, launcher: "SlurmLauncher", name: str):
        self.launcher, self.name = launcher, name

    def __fspath__(self) -> str:
        layout = self.launcher.job_layout
        root = layout.root if layout is not None else \
            self.launcher.config.layout.root / ".not-submitted"
        return str(root / self.name)

    def __str__(self) -> str:
        return self.__fspath__()


def _batch_cause(record: slurmctl.JobRecord) -> str:
    """The first ``error: ...`` line of the batch output: the job's own fluidctl's one-line
    refusal when the step never started (e.g. a node name that does not resolve)."""
    try:
        text = record.layout.slurm_output_of(record.job_id).read_text(errors="replace")
    except OSError:
        return ""
    return next((line.strip() for line in text.splitlines()
                 if line.lstrip().startswith("error: ")), "")


def submitted_failure(record: slurmctl.JobRecord, state: str, code: Optional[int]) -> Failure:
    """Why a submitted job failed, from what it left: the failing rank srun reported (with the
    cause quoted when the rank said it before its log existed), else the batch output's
    one-line error, else Slurm's state and exit code."""
    layout = record.run_layout
    output = str(record.layout.slurm_output_of(record.job_id))
    try:
        failure = srun_failure(layout.srun.read_text(errors="replace"), layout)
    except OSError:
        failure = None
    if failure is not None:
        return failure
    cause = _batch_cause(record)
    failure = Failure(f"slurm job {record.job_id}", "slurm", code or 1, output,
                      detail=f"{state}, exit code {code}")
    if cause:
        failure.explanation = f"{cause} (batch output {output})"
    return failure


def _hang_detail(layout: LogLayout) -> str:
    """What the batch job's fluidctl wrote of its hang into LOG_DIR/failure.json."""
    try:
        import json
        hang = json.loads(layout.failure_json.read_text())["hang"]
        return f"hung: {hang['why']}; every rank's stack: {hang['dir']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "hung (exit code 124): see the batch output and LOG_DIR/hang-*/"


# --- the launcher ---------------------------------------------------------------------------
def slurm_options(config) -> "slurmplan.SlurmOptions":
    """``--backend slurm``'s parsed options (its options.py ``configure``), or none given."""
    return config.backend_options or slurmplan.SlurmOptions()


class SlurmLauncher(BaseLauncher):
    """``--backend slurm``: one srun step inside an allocation, else sbatch + follow."""
    name = "slurm"

    def __init__(self, log=None):
        super().__init__(log)
        self.config = None
        self.alloc: Optional[slurmplan.Allocation] = None
        self.steps: List[dict] = []
        self.spec: Optional[slurmctl.SbatchSpec] = None
        self.nodes: List[str] = []          # the trainers' nodes (inside an allocation)
        self.failed: set = set()            # nodes a step failed on, left out of restarts
        self.python = sys.executable
        self.world = 0
        self.job_layout: Optional[LogLayout] = None     # the submitted job's own log dir
        self.request_at: Optional[float] = None   # --checkpoint-warning before the time limit

    def echo_sources(self, plan, tee: str, ranks=None):
        """Inside an allocation, as every backend; for a submitted job, the same ranks' logs
        in its own directory (LOG_DIR/slurm-JOBID/), known once sbatch has answered."""
        sources = super().echo_sources(plan, tee, ranks)
        if self.alloc is not None:
            return sources
        return [(_JobLogPath(self, Path(path).name), prefix) for path, prefix in sources]

    @property
    def owns_log_dir(self) -> bool:
        return self.alloc is not None       # sbatch + follow: the batch job owns it

    def prepare(self, config):
        self.config = config
        options = slurm_options(config)
        if config.hosts or config.pserver_endpoints:
            raise UsageError("--backend slurm takes its nodes from Slurm",
                             "drop --hostfile/--hosts/--pserver-endpoints; use --nodes")
        alloc = slurmplan.allocation(os.environ)
        if options.detach:
            alloc = None                      # --detach always submits a new job
        self.alloc = alloc
        nodes = slurmplan.job_nodes(options, alloc)
        if alloc is not None:       # the allocation's nodes less the ledgered ones
            from fluidctl.cluster import ledger
            usable = ledger.usable(alloc.nodes, options.nodes or 1, config.include_bad,
                                   say=lambda line: print(line, file=sys.stderr, flush=True))
            nodes = usable[:options.nodes] if options.nodes else usable
            if not options.nodes and len(nodes) < len(alloc.nodes):
                print(f"warning: the job runs on {len(nodes)} of the allocation's "
                      f"{len(alloc.nodes)} nodes, the others being in the bad-node ledger "
                      "(--include-bad uses them)", file=sys.stderr, flush=True)
        per_node = slurmplan.ranks_per_node(config.nproc, config.gpus, alloc)
        pservers = slurmplan.pserver_count(config.mode, config.pservers, len(nodes))
        job = config.job([])
        python = config.interpreter
        rank_argv = worker_command(python, config.script, config.script_args)
        pserver_argv = worker_command(python, python, ["-u", "-m", "fluidctl.runtime.pserver",
                                                       "--no-state", *config.pserver_args])
        layout = LogLayout(config.layout.root.resolve())
        env = slurmplan.step_env(log_dir=layout.root, token=config.token,
                                 user_env=config.user_env)
        from fluidctl.planning.plan import LaunchCommand, Node
        job.nodes = [Node(n, per_node, (), n, 1 if i < pservers else 0)
                     for i, n in enumerate(nodes)]
        if alloc is None:
            self.spec = self._batch_spec(options, layout, len(nodes), per_node)
            slurmctl.test_only(self.spec)
            commands = [LaunchCommand("login node", ["sbatch", "--parsable",
                                                     str(layout.sbatch_script_of("JOBID"))])]
            return slurmplan.plan_slurm(job, nodes, per_node, pservers, rank_argv, pserver_argv,
                                        env, [f"{n}:?" for n in nodes[:pservers]], commands)
        slurmplan.check_step_options(alloc, options)
        if options.checkpoint_warning:         # salloc, or a batch script of one's own
            end = job_end(alloc.job_id)
            self.request_at = end - options.checkpoint_warning if end else None
        slurmplan.check_gpus(alloc, config.gpus, os.environ, options.slurm_args)
        slurmplan.check_cpus(alloc, nodes, per_node, os.environ, options.slurm_args)
        slurmctl.find("srun")
        self.nodes, self.python, self.world = list(nodes), python, len(nodes) * per_node
        eps = slurmplan.pserver_endpoints(alloc.job_id, nodes, pservers)
        self.steps = self._steps(nodes, per_node, pservers, eps, rank_argv, pserver_argv)
        commands = [LaunchCommand(f"allocation {alloc.job_id}", step["argv"])
                    for step in self.steps]
        return slurmplan.plan_slurm(job, nodes, per_node, pservers, rank_argv, pserver_argv, env,
                                    eps, commands)

    def _steps(self, nodes, per_node, pservers, eps, rank_argv, pserver_argv) -> List[dict]:
        extra = slurm_options(self.config).slurm_args
        subset = nodes if len(nodes) < len(self.alloc.nodes) else ()
        steps = []
        trainer_env = {}
        if pservers:
            common = {envs.PSERVERS_IP_PORT_LIST: ",".join(eps),
                      envs.SYNC_MODE: "sync" if self.config.sync else "async"}
            steps.append({"role": "pserver", "name": step_name(), "env": {
                **common, envs.TRAINING_ROLE: envs.ROLE_PSERVER,
                envs.TRAINERS_NUM: str(len(nodes) * per_node)},
                "argv": None, "nodes": pservers, "per_node": 1, "nodelist": nodes[:pservers],
                "overlap": True, "command": pserver_argv})
            trainer_env = {**common, envs.TRAINING_ROLE: envs.ROLE_TRAINER}
        steps.append({"role": "trainer", "name": step_name(), "env": trainer_env,
                      "nodes": len(nodes), "per_node": per_node, "nodelist": subset,
                      "overlap": False, "command": rank_argv})
        for step in steps:
            step["argv"] = srun_argv(nodes=step["nodes"], ntasks_per_node=step["per_node"],
                                     name=step["name"], command=step["command"],
                                     nodelist=step["nodelist"], overlap=step["overlap"],
                                     extra=extra)
        return steps

    def _batch_spec(self, options, layout: LogLayout, nodes: int, per_node: int):
        from fluidctl import __version__
        config = self.config
        return slurmctl.SbatchSpec(
            job_name=options.job_name or (Path(config.script).stem or "fluidctl"),
            nodes=nodes, ntasks_per_node=per_node,
            command=slurmplan.inner_train_argv(config, layout.slurm_job("%j").root),
            workdir=os.getcwd(),
            output=str(layout.slurm_output), exit_file=str(layout.job_exit("%j")),
            gpus_per_node=per_node if config.gpus is not None else 0, options=options,
            header=f"written by fluidctl {__version__} (fluidctl train --backend slurm); "
                   "submitted with sbatch --parsable")

    def diagnostics(self, config):
        """Inside an allocation, stacks taken on the nodes by an overlapping srun step
        (``nodediag``); a submitted job's own fluidctl (in its batch script) watches for hangs
        and stragglers and keeps job.json, failure.json and stragglers.*, not this follower,
        which says the straggler lines that job writes (``followed``)."""
        if self.alloc is None:
            from fluidctl.diagnostics.followed import FollowedDiagnostics
            self._diagnostics = FollowedDiagnostics(
                lambda: self.job_layout.root if self.job_layout is not None else None,
                tail_lines=config.log_tail)
            return self._diagnostics
        from fluidctl.diagnostics.shareddir import SharedDirDiagnostics

        def stack_takers(diag_dir: str) -> List[List[str]]:
            return [srun_argv(nodes=len(self.nodes), ntasks_per_node=1, name=step_name(),
                              command=[self.python, "-m", "fluidctl.node.stacks", diag_dir],
                              nodelist=self.nodes, overlap=True, fail_fast=False)]
        self._diagnostics = SharedDirDiagnostics.for_job(config, stack_takers=stack_takers,
                                                         world=self.world)
        return self._diagnostics

    def describe(self, plan, show_secrets: bool = False) -> str:
        """--dry-run shows the batch script it would submit."""
        return slurmctl.sbatch_script(self.spec) if self.spec is not None else ""

    def start(self, plan, attempt: int):
        layout = LogLayout(self.config.layout.root.resolve())
        base_env = {**os.environ, **plan.procs[-1].env, envs.RESTART_COUNT: str(attempt)}
        if self.alloc is None:
            record = slurmctl.submit(self.spec, layout)
            self.job_layout = record.run_layout
            say = f"submitted Slurm job {record.job_id} ({self.spec.nodes} node(s) x " \
                  f"{self.spec.ntasks_per_node}); script {record.script}, logs {record.log_dir}"
            print(f"fluidctl: {say}", file=sys.stderr, flush=True)
            self.log(say)
            if slurm_options(self.config).detach:
                print(f"fluidctl: {slurmctl.how_to_follow(record.job_id)}", file=sys.stderr,
                      flush=True)
            return [SubmittedJob(record, detached=slurm_options(self.config).detach)]
        if attempt:
            self._leave_out_failed_node(layout)
        handles = []
        try:
            for step in self.steps:
                diag = self.diag_env() if step["role"] == "trainer" else {}
                handles.append(SrunStep(step["argv"], {**base_env, **step["env"], **diag}, layout,
                                        job_id=self.alloc.job_id, name=step["name"],
                                        role=step["role"], service=step["role"] == "pserver"))
        except BaseException:
            for h in handles:
                h.kill()
            raise
        return handles

    def _leave_out_failed_node(self, layout: LogLayout) -> None:
        """Before a restart inside an allocation: a node that Slurm says failed (srun's "Node
        failure on NODE") goes to the bad-node ledger (STEP_FAILED) and, where the allocation
        has a node to spare beyond the step's --nodes, the step runs again without it (srun
        --exclude). A task's exit code or signal is the job's, not the node's: the step runs
        again on the same nodes and nothing is ledgered (docs/blame.md)."""
        try:
            text = layout.srun.read_text(errors="replace")
        except OSError:
            text = ""
        node = node_failure(text)
        if node is None or node not in self.alloc.nodes:
            found = first_failed_task(text)
            if found is not None:
                self.log(f"task {found[0]} on {found[1]} failed ({describe_exit(found[2])}): "
                         "the job's failure, not the node's; running again on the same nodes")
            return
        from fluidctl.cluster import ledger
        ledger.record(node, ledger.STEP_FAILED, "Slurm reported a node failure there",
                      job=self.alloc.job_id)
        self.failed.add(node)
        spare = [n for n in self.alloc.nodes if n not in self.failed]
        need = len(self.nodes)
        if node not in self.nodes:
            return
        if len(spare) < need or any(s["role"] == "pserver" for s in self.steps):
            say = (f"{node} failed (Slurm: node failure); the allocation has no node to spare "
                   f"for the {need} the step needs: running again on the same nodes")
        else:
            self.nodes = spare[:need]
            trainer = self.steps[-1]
            trainer["nodelist"] = self.nodes
            trainer["argv"] = srun_argv(
                nodes=need, ntasks_per_node=trainer["per_node"], name=trainer["name"],
                command=trainer["command"], nodelist=self.nodes,
                extra=[f"--exclude={','.join(sorted(self.failed))}",
                       *slurm_options(self.config).slurm_args])
            say = (f"{node} failed (Slurm: node failure): running the step again on "
                   f"{','.join(self.nodes)} (srun --exclude={','.join(sorted(self.failed))}); "
                   f"{node} is in the bad-node ledger")
        print(f"fluidctl: {say}", file=sys.stderr, flush=True)
        self.log(say)
        self.log(f"runs on allocation {self.alloc.job_id}: {' '.join(self.steps[-1]['argv'])}")

    def logs(self, plan) -> List[str]:
        layout = self.config.layout
        if self.alloc is None:
            return []           # the submitted job's own fluidctl makes LOG_DIR/slurm-JOBID/
        extra = [str(layout.srun)] + ([str(layout.srun_pserver)] if len(self.steps) > 1 else [])
        return [p.log for p in plan.procs] + extra
