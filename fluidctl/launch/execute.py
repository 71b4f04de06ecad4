"""One ``fluidctl train`` from a LaunchConfig to an exit code, the same for every backend.

``launch(config, launcher)``: ``launcher.prepare(config)`` makes the Plan; ``--dry-run`` prints
it and stops; otherwise ``execute(plan, launcher, config)`` runs it; ``launcher.close()``
always. ``execute`` owns what every backend shares: the log dir and fresh logs, endpoints.log,
launch.log, the console echo, supervision (fail fast, restarts, signals) with the launcher's
``start`` making each attempt's handles, the sweep of leftover processes and the one failure
report.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from fluidctl.launch.launchlog import LaunchLog
from fluidctl.planning.plan import Plan

if TYPE_CHECKING:
    from fluidctl.backends.base import Launcher
    from fluidctl.launch.supervisor import RunResult
    from fluidctl.planning.config import LaunchConfig


def launch(config: "LaunchConfig", launcher_name: Optional[str] = None, *,
           dry_run: bool = False, as_json: bool = False, show_secrets: bool = False) -> int:
    """Plan with the backend ``launcher_name`` (default: ``config.backend``), then print the
    plan (``dry_run``) or run it. Returns the job's exit code."""
    from fluidctl import backends
    launch_log = LaunchLog()       # lines wait in memory until the log dir exists
    launcher = backends.launcher(launcher_name or config.backend, launch_log)
    try:
        plan = launcher.prepare(config)
        config.check_tee_ranks(len(plan.trainers))
        _check_metrics(config, launcher)
        if dry_run:
            if as_json or launcher.dry_run_table:
                print_plan(plan, as_json, show_secrets)
            if not as_json:      # --show-secrets: the k8s YAML with its Secret's token
                print(launcher.describe(plan, show_secrets), end="")
            return 0
        if launcher.submits:        # the cluster runs it (k8s)
            return launcher.submit(plan, config)
        return execute(plan, launcher, config, launch_log).exit_code
    finally:
        launcher.close()
        launch_log.close()


def execute(plan: Plan, launcher: "Launcher", config: "LaunchConfig",
            launch_log: Optional[LaunchLog] = None) -> RunResult:
    """Run ``plan`` through ``launcher`` under supervision; print the failure report if the
    job failed."""
    layout = config.layout
    owner = launcher.owns_log_dir
    lock = None
    try:
        with _log_dir_errors(layout):
            layout.create()
            lock = _lock_log_dir(layout) if owner else None
        return _execute(plan, launcher, config, launch_log, layout, owner)
    finally:
        if lock is not None:
            os.close(lock)


class _log_dir_errors:
    """An OSError while the log dir is made ready (a full disk, a read-only file system),
    before anything starts: one line, exit 2."""

    def __init__(self, layout):
        self.layout = layout
        self.made = not os.path.lexists(layout.root)     # by this run: removed on an error

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, OSError):
            from fluidctl.errors import UsageError
            if self.made:
                import shutil
                shutil.rmtree(self.layout.root, ignore_errors=True)
            raise UsageError(f"cannot write the log dir {self.layout.root}: "
                             f"{exc.strerror or exc}",
                             "free some space or pass another --log-dir") from None
        return False


def _execute(plan, launcher, config, launch_log, layout, owner: bool) -> RunResult:
    launch_log = launch_log or LaunchLog()
    with _log_dir_errors(layout):
        _ready_logs(plan, launcher, launch_log, layout, owner)
    logs = launcher.logs(plan)
    from fluidctl.launch.requests import REQUEUE_EXIT, RequestChannel, mark_requeue
    checkpoint = (RequestChannel(layout.root.resolve(), config.checkpoint_signal)
                  if owner else None)       # a submitted job's own fluidctl has its own
    if checkpoint is not None:              # the ranks it starts itself answer requests
        launcher.request_env = checkpoint.rank_env()
    # live.json and --metrics-port: by the launcher that supervises the ranks (a submitted
    # Slurm job's own fluidctl, not the follower on the login node)
    watching = _watching(config, launcher, layout, launch_log) if owner else None
    first = None
    try:
        diagnostics = launcher.diagnostics(config)      # the ranks get its env()
        if launcher.starts_first:   # then the supervisor's modules load while they start
            from fluidctl.launch.firststart import FirstStart
            first = FirstStart(lambda attempt: launcher.start(plan, attempt), logs,
                               grace=config.grace_period, checkpoint=checkpoint is not None)
        from fluidctl.launch import run
        from fluidctl.launch.supervisor import RunOptions
        shown = run.ConsoleOutput(
            sources=launcher.echo_sources(plan, config.tee, config.tee_ranks),
            report=run.failure_reporter(config.log_tail, layout.failure_json),
            on_hang=run.hang_reporter)
        from fluidctl.launch.relay import RequestRelay
        relay = (RequestRelay(checkpoint.layout.checkpoint_request, launcher.relay_checkpoint)
                 if checkpoint is not None else _NoRelay())
        with relay:     # fluidctl job checkpoint's "save", to the nodes with their own file
            result = run.run_supervised(
                lambda attempt: launcher.start(plan, attempt), logs=logs,
                launch_log=launch_log, shown=shown,
                options=RunOptions(config.grace_period, config.max_restarts, checkpoint,
                                   launcher.request_at),
                watchers=run.RunWatchers(diagnostics=diagnostics, watching=watching),
                first=first)
    except BaseException:
        if first is not None:
            first.abandon()         # when run_supervised never took its processes over
        raise
    finally:
        if watching is not None:        # run_supervised stops it; this, if it never began
            watching.close()
    if owner:
        _checkpoint_failures(plan, result, launch_log)
    if result.exit_code == REQUEUE_EXIT and result.failure is None:   # ours, not a rank's 75
        mark_requeue(checkpoint.asked if checkpoint else "")
    return result


def _check_metrics(config, launcher) -> None:
    """--metrics-port where nothing of fluidctl's serves it, or --metrics-host without it:
    one line, dry run or not (an option is honoured or refused, never dropped)."""
    from fluidctl.errors import UsageError
    from fluidctl.planning.config import LaunchConfig
    if config.metrics_port is not None and launcher.submits:
        raise UsageError(f"--metrics-port is served by fluidctl's own launcher; under "
                         f"--backend {launcher.name} the cluster runs the job",
                         "leave --metrics-port out (scrape the pods' own metrics)")
    if config.metrics_port is None and config.metrics_host != LaunchConfig.metrics_host:
        raise UsageError("--metrics-host is where --metrics-port serves, and no "
                         "--metrics-port was given", "add --metrics-port PORT, or leave "
                         "--metrics-host out")


def _watching(config, launcher, layout, launch_log):
    """live.json for ``fluidctl top`` and, with --metrics-port, the metrics endpoint (bound
    now: a port in use is one line before anything starts)."""
    from fluidctl.observe.watching import Watching
    meta = {"backend": launcher.name, "job": Path(config.script).stem,
            "hang_timeout": config.hang_timeout}
    watching = Watching(layout.root.resolve(), meta, config.metrics_host, config.metrics_port)
    if watching.url:
        launch_log(f"metrics: {watching.url}")
        import sys
        print(f"fluidctl: metrics at {watching.url}", file=sys.stderr, flush=True)
    return watching


class _NoRelay:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _checkpoint_failures(plan: Plan, result: RunResult, launch_log: LaunchLog) -> None:
    """The pservers' failed checkpoints (their logs say so) reach the job: a warning on the
    console and in launch.log, and exit code 1 for a job that otherwise succeeded when a
    pserver's final checkpoint could not be saved (README, "Checkpoints")."""
    import sys
    from fluidctl.diagnostics import checkpoints as ckptreport
    from fluidctl.planning.plan import PSERVER
    pservers = [(p.label, p.log) for p in plan.procs if p.role == PSERVER]
    if not pservers:
        return

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    if ckptreport.report(pservers, say, launch_log) and result.exit_code == 0:
        result.exit_code = 1
        launch_log("exit code 1: a final checkpoint could not be saved")


def _ready_logs(plan, launcher, launch_log, layout, owner: bool) -> None:
    logs = launcher.logs(plan)
    if plan.master:                 # mpi: the ranks choose their endpoints at start
        plan.write_endpoints(layout)
    launch_log.attach(str(layout.launch))
    nodes = len(plan.job.nodes)
    launch_log(f"fluidctl job over {plan.backend}: {len(plan.trainers)} trainer(s) on "
               f"{nodes} node(s), mode {plan.job.mode}, master {plan.master or 'chosen by rank 0'}, "
               f"argv {plan.trainers[0].argv if plan.trainers else []}")
    for command in plan.commands:
        launch_log(f"runs on {command.host}: {' '.join(command.argv)}"
                   + (f" (in {command.cwd})" if command.cwd else ""))
    if owner:
        from fluidctl.launch.logfiles import clear_stale
        for stale in clear_stale(layout, logs):
            launch_log(f"removed {stale}: an earlier job's log, not this job's")


def _lock_log_dir(layout) -> int:
    """Refuse a log dir another running job writes to (two jobs would truncate and mix each
    other's logs); the lock (flock, released by the kernel when we exit) names the holder."""
    import fcntl
    from fluidctl.errors import UsageError
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UsageError(f"log dir {layout.root} is used by another running fluidctl job "
                         f"(pid {holder})", "pass another --log-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def print_plan(plan: Plan, as_json: bool, show_secrets: bool = False) -> None:
    """--dry-run: the plan as a table (and the commands the backend itself runs), or JSON
    (the job token masked unless ``show_secrets``: plans get pasted into issues)."""
    import click
    if as_json:
        record = plan.to_json()
        if not show_secrets:
            record = _masked(record)
        click.echo(json.dumps(record, indent=2))
        return
    from fluidctl.console import print_plan_table
    print_plan_table(plan)
    import shlex
    for command in plan.commands:
        cd = f"cd {shlex.quote(command.cwd)} && " if command.cwd else ""
        click.echo(f"{command.host}: {cd}{shlex.join(command.argv)}")


def _masked(value):
    """``value`` with every FLUIDCTL_JOB_TOKEN value replaced by ``***``."""
    from fluidctl import envs
    if isinstance(value, dict):
        return {k: ("***" if k == envs.JOB_TOKEN and v else _masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str) and f"{envs.JOB_TOKEN}=" in value:      # inline in a command
        import re
        return re.sub(rf"({envs.JOB_TOKEN}=)(\S+)", r"\1***", value)
    return value
