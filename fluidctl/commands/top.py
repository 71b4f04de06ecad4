"""``fluidctl top``: options and help only; the work is ``fluidctl.observe.top.run`` on the
job's log dir, found as ``fluidctl job`` finds a job (the job verbs of the backend that owns
it: a log dir of a job run from here, a Slurm job id)."""
from __future__ import annotations

import click

from fluidctl.commands.numbers import seconds

EPILOG = """\b
Examples:
  fluidctl top                        # the job started with the default --log-dir mylog
  fluidctl top runs/exp3              # a job's --log-dir (local, ssh, fabric, mpi)
  fluidctl top 1234                   # a Slurm job fluidctl submitted from here
  fluidctl top pytorchjob/bert --namespace ml-team    # its pods, through your kubeconfig
  fluidctl top runs/exp3 --sort p99 --reverse
  fluidctl top runs/exp3 --once --json | jq '.ranks[] | select(.verdict != "")'
"""


def source(job, log_dir, namespace):
    """What to read: --log-dir, else JOB through its backend's job verbs (its log dir, or a
    reader of its own: a Kubernetes job's pods)."""
    from pathlib import Path

    from fluidctl import backends
    from fluidctl.errors import UsageError
    from fluidctl.paths import DEFAULT_LOG_DIR
    if job is None:
        root = Path(log_dir or DEFAULT_LOG_DIR)
        if not root.is_dir():
            raise UsageError(f"no job in {root} (not a directory)",
                             "give the job's --log-dir, e.g. fluidctl top --log-dir runs/exp3")
        return root
    if log_dir:
        raise UsageError("JOB and --log-dir both given", "give one of them")
    if Path(job).is_dir():              # a log dir, even before its launch.log exists
        return Path(job)
    owner = backends.owner_of(job)
    reader = getattr(owner.verbs(), "reader", None)
    if reader is not None:
        try:
            return reader(job, namespace=namespace)
        except UsageError as exc:       # runs/exp3: a log dir that is not there, most likely
            raise UsageError(f"no log dir {job} here, and {exc.message}", exc.hint) from None
    verb = getattr(owner.verbs(), "log_dir", None)
    if verb is None:
        raise UsageError(f"{job} is no log dir here, and fluidctl top does not watch "
                         f"{owner.title} jobs",
                         f"give a job's --log-dir or a Slurm job id; for a {owner.title} job "
                         f"use fluidctl job status/logs")
    return verb(job)


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("job", required=False)
@click.option("--log-dir", default=None,
              help="The running job's --log-dir (default mylog), e.g. --log-dir runs/exp3.")
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts).")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable frames: one JSON object a line (with --once: one).")
@click.option("--sort", type=click.Choice(["rank", "step", "p50", "p99", "cpu", "rss",
                                           "node"]),
              default="rank", show_default=True, help="Order of the rows, e.g. --sort p99 "
              "(key s cycles it while the view runs).")
@click.option("--reverse", is_flag=True, help="Reverse the order (key r).")
@click.option("--filter", "text", default=None,
              help="Only rows whose node, state or verdict contains TEXT, e.g. --filter slow.")
@click.option("--flagged", is_flag=True,
              help="Only ranks with a verdict or that do not run (key f).")
@click.option("--interval", type=seconds(0.2, 3600, "--interval 2"), default=1.0,
              show_default=True, help="Seconds between frames, e.g. --interval 2.")
@click.option("--namespace", default="default", show_default=True,
              help="Kubernetes jobs (KIND/NAME): their namespace, e.g. --namespace ml-team.")
def top(job, log_dir, once, as_json, sort, reverse, text, flagged, interval, namespace):
    """A running job, live: a header (job, backend, world, attempt, uptime, steps/s, ETA when
    the script prints 'step N/TOTAL') and one row per rank (per node when they do not fit):
    state, step, step time p50/p99, data/compute/communication share, CPU%, RSS, GPU (with
    nvidia-ml-py), the straggler or hang verdict and the last log line. Read from what the
    launcher already writes in the log dir; the ranks do nothing new. Keys: s sort, r
    reverse, f flagged, q quit."""
    from fluidctl.observe.top import View, run
    raise SystemExit(run(source(job, log_dir, namespace), once=once, json_out=as_json,
                         interval=interval, view=View(sort, reverse, text, flagged)))
