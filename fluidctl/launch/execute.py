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
from typing import TYPE_CHECKING, Optional

from fluidctl.launch import run
from fluidctl.launch.supervisor import LaunchLog, RunOptions, RunResult
from fluidctl.planning.plan import Plan

if TYPE_CHECKING:
    from fluidctl.backends.base import Launcher
    from fluidctl.planning.config import LaunchConfig


def launch(config: "LaunchConfig", launcher_name: Optional[str] = None, *,
           dry_run: bool = False, as_json: bool = False) -> int:
    """Plan with the backend ``launcher_name`` (default: ``config.backend``), then print the
    plan (``dry_run``) or run it. Returns the job's exit code."""
    from fluidctl import backends
    launch_log = LaunchLog()       # lines wait in memory until the log dir exists
    launcher = backends.launcher(launcher_name or config.backend, launch_log)
    try:
        plan = launcher.prepare(config)
        if dry_run:
            print_plan(plan, as_json)
            if not as_json and getattr(launcher, "describe", None):
                print(launcher.describe(plan), end="")
            return 0
        return execute(plan, launcher, config, launch_log).exit_code
    finally:
        launcher.close()
        launch_log.close()


def execute(plan: Plan, launcher: "Launcher", config: "LaunchConfig",
            launch_log: Optional[LaunchLog] = None) -> RunResult:
    """Run ``plan`` through ``launcher`` under supervision; print the failure report if the
    job failed."""
    layout = config.layout
    layout.create()
    if plan.master:                 # mpi: the ranks choose their endpoints at start
        run.write_endpoints(layout, plan)
    launch_log = launch_log or LaunchLog()
    launch_log.attach(str(layout.launch))
    nodes = len(plan.job.nodes)
    launch_log(f"fluidctl job over {plan.backend}: {len(plan.trainers)} trainer(s) on "
               f"{nodes} node(s), mode {plan.job.mode}, master {plan.master or 'chosen by rank 0'}, "
               f"argv {plan.trainers[0].argv if plan.trainers else []}")
    for command in plan.commands:
        launch_log(f"runs on {command.host}: {' '.join(command.argv)}")
    return run.run_supervised(
        lambda attempt: launcher.start(plan, attempt), logs=launcher.logs(plan),
        launch_log=launch_log, options=RunOptions(config.grace_period, config.max_restarts),
        sources=launcher.echo_sources(plan, config.tee),
        report=run.failure_reporter(config.log_tail))


def print_plan(plan: Plan, as_json: bool) -> None:
    """--dry-run: the plan as a table (and the commands the backend itself runs), or JSON."""
    import click
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))
        return
    from fluidctl.console import console, plan_table
    console().print(plan_table(plan))
    import shlex
    for command in plan.commands:
        click.echo(f"{command.host}: {shlex.join(command.argv)}")
