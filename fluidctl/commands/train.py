"""``fluidctl train``: plan a job, start it, supervise it, leave a log per process."""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import List, Optional

import click

from fluidctl.errors import UsageError
from fluidctl.launch import devices, options as opts
from fluidctl.launch.plan import JobSpec, Node, Plan, plan as make_plan
from fluidctl.paths import DEFAULT_LOG_DIR, LogLayout

TEE_CHOICES = ("rank0", "all", "none")
CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"],
           "max_content_width": 100}

EPILOG = """\b
Examples:
  fluidctl train --nproc 2 templates/train_nccl2.py --epochs 3
  fluidctl train --gpus 0,2,3 train.py
  fluidctl train --mode pserver --pservers 2 --nproc 2 templates/train_pserver.py
  fluidctl train --nproc 4 --dry-run --json train.py
"""


def _positive(name: str):
    def check(ctx, param, value):
        if value is not None and value <= 0:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
        return value
    return check


def _non_negative(name: str):
    def check(ctx, param, value):
        if value is not None and value < 0:
            raise click.BadParameter(f"must be >= 0, got {value}", param_hint=name)
        return value
    return check


@click.command(context_settings=CONTEXT, epilog=EPILOG)
@click.option("--nproc", "--nproc-per-node", "nproc", type=int, callback=_positive("--nproc"),
              help="CPU processes (trainers) per node, e.g. --nproc 4. Default: one per GPU, "
                   "else 1.")
@click.option("--gpus", metavar="N|IDS",
              help="One process per GPU: a count (--gpus 4) or ids (--gpus 0,2,3; one id: 3,).")
@click.option("--mode", type=click.Choice(["collective", "pserver"]), default="collective",
              show_default=True, help="collective (NCCL2/gloo allreduce) or pserver "
                                      "(parameter servers), e.g. --mode pserver.")
@click.option("--pservers", type=int, default=None, callback=_positive("--pservers"),
              help="Parameter servers to start in pserver mode, e.g. --pservers 2 (default 1).")
@click.option("--pserver-endpoints", metavar="IP:PORT,...",
              help="Use parameter servers already running instead of starting them, e.g. "
                   "--pserver-endpoints 10.0.0.1:7164,10.0.0.2:7164.")
@click.option("--sync/--async", "sync", default=True, show_default=True,
              help="pserver mode: a barrier per step (--sync) or apply gradients as they come.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="pserver mode: pservers checkpoint here, e.g. --checkpoint-dir ckpt/.")
@click.option("--checkpoint-every", type=int, default=None, callback=_positive("--checkpoint-every"),
              help="pserver mode: checkpoint every K steps, e.g. --checkpoint-every 100.")
@click.option("--started-port", type=int, default=None,
              help="Use ports P, P+1, ... instead of free ones, e.g. --started-port 6170.")
@click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True,
              help="Where workerlog.N, serverlog.N, endpoints.log and launch.log go.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Add to every process's environment (repeatable), e.g. --env NCCL_DEBUG=INFO.")
@click.option("--env-file", type=str, default=None,
              help="KEY=VALUE lines added to every process's environment, e.g. --env-file job.env.")
@click.option("--grace-period", type=float, default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping, e.g. --grace-period 10.")
@click.option("--max-restarts", type=int, default=0, show_default=True,
              callback=_non_negative("--max-restarts"),
              help="Restart the whole group up to N times on failure, e.g. --max-restarts 3.")
@click.option("--tee", type=click.Choice(TEE_CHOICES), default="rank0", show_default=True,
              help="Echo rank 0's output (rank0), every rank's with a [trainer N] prefix (all), "
                   "or none.")
@click.option("--log-tail", type=int, default=20, show_default=True,
              help="Lines of the failing rank's log shown in the failure report.")
@click.option("--dry-run", is_flag=True, help="Print the plan (a table) and start nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: print the plan, environments included, as JSON.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def train(nproc, gpus, mode, pservers, pserver_endpoints, sync, checkpoint_dir, checkpoint_every,
          started_port, log_dir, env_pairs, env_file, grace_period, max_restarts, tee, log_tail,
          dry_run, as_json, script, script_args):
    """Run SCRIPT as a distributed training job.

    SCRIPT ending in .py runs with fluidctl's own Python (-u); anything else is executed.
    SCRIPT_ARGS are passed to it untouched, options included.
    """
    if as_json and not dry_run:
        raise UsageError("--json only works with --dry-run", "add --dry-run")
    if grace_period < 0:
        raise UsageError(f"--grace-period {grace_period} is negative", "use 0 or more seconds")
    script_path = opts.check_script(script)
    user_env = opts.read_env_file(env_file)
    user_env.update(opts.parse_env_pairs(env_pairs))
    node = _local_node(nproc, gpus, mode, pservers, pserver_endpoints)
    layout = LogLayout(Path(log_dir))
    if layout.root.exists() and not layout.root.is_dir():
        raise UsageError(f"log dir {log_dir} is a file", "pass --log-dir with a directory path")
    job = JobSpec(script=script_path, script_args=list(script_args), nodes=[node], mode=mode,
                  pserver_endpoints=_split_endpoints(pserver_endpoints), sync=sync,
                  pserver_args=_pserver_args(checkpoint_dir, checkpoint_every),
                  log_dir=log_dir, user_env=user_env, token=secrets.token_hex(16))

    from fluidctl.launch.ports import PortReservation
    reservation = PortReservation(node.address, job.ports_needed(0), started_port)
    try:
        the_plan = make_plan(job, {0: reservation.ports})
        if dry_run:
            _print_plan(the_plan, as_json)
            return
        code = _run_local(the_plan, layout, reservation, grace_period, max_restarts, tee,
                          log_tail)
    finally:
        reservation.release()
    sys.exit(code)


def _local_node(nproc, gpus, mode, pservers, pserver_endpoints) -> Node:
    if gpus is not None or nproc is None:
        found = devices.select_gpus(gpus, devices.discover_gpus(os.environ)) \
            if gpus is not None else devices.discover_gpus(os.environ)
    else:
        found = []
    if gpus is not None and nproc is not None and nproc != len(found):
        raise UsageError(f"--nproc {nproc} and --gpus {gpus} ({len(found)} GPUs) disagree",
                         "give only one of them: --gpus starts one process per GPU")
    count = len(found) if found else (nproc or 1)
    if mode != "pserver":
        if pservers or pserver_endpoints:
            raise UsageError("--pservers/--pserver-endpoints need --mode pserver",
                             "add --mode pserver")
        return Node("127.0.0.1", count, tuple(found))
    if pservers and pserver_endpoints:
        raise UsageError("--pservers and --pserver-endpoints both given",
                         "start pservers here (--pservers N) or use running ones, not both")
    return Node("127.0.0.1", count, tuple(found),
                pservers=0 if pserver_endpoints else (pservers or 1))


def _split_endpoints(text: Optional[str]) -> List[str]:
    if not text:
        return []
    eps = [e.strip() for e in text.split(",") if e.strip()]
    for ep in eps:
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"malformed pserver endpoint {ep!r}",
                             "write IP:PORT,IP:PORT, e.g. 127.0.0.1:7164")
    return eps


def _pserver_args(checkpoint_dir, checkpoint_every) -> List[str]:
    args = []
    if checkpoint_dir:
        args += ["--checkpoint-dir", os.path.abspath(checkpoint_dir)]
    if checkpoint_every:
        args += ["--checkpoint-every", str(checkpoint_every)]
    return args


def _print_plan(the_plan: Plan, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(the_plan.to_json(), indent=2))
        return
    from fluidctl.console import console, plan_table
    console().print(plan_table(the_plan))


def _run_local(the_plan: Plan, layout: LogLayout, reservation, grace_period: float,
               max_restarts: int, tee: str, log_tail: int) -> int:
    from fluidctl.console import print_failure
    from fluidctl.launch import run
    from fluidctl.launch.supervisor import LaunchLog, RunOptions

    layout.create()
    run.write_endpoints(layout, the_plan)
    launch_log = LaunchLog(str(layout.launch))
    launch_log(f"fluidctl job: {len(the_plan.trainers)} trainer(s), mode {the_plan.job.mode}, "
               f"master {the_plan.master}, argv {the_plan.trainers[0].argv}")

    def start(attempt: int):
        handles = run.start_local(the_plan.procs, attempt)
        reservation.release()                     # the processes hold their ports now
        return handles

    try:
        result = run.run_supervised(
            start, logs=[p.log for p in the_plan.procs], launch_log=launch_log,
            options=RunOptions(grace_period, max_restarts),
            sources=run.echo_sources(the_plan.procs, tee),
            report=lambda failure: print_failure(failure, log_tail))
    finally:
        launch_log.close()
    return result.exit_code
