"""``fluidctl dump``: every rank's Python stack of a running job, on demand.

The running launcher (``fluidctl train``) keeps its pid in LOG_DIR/job.json; ``fluidctl dump``
sends it SIGUSR1, the launcher takes every rank's stack on every node (the same code as
``--hang-timeout``: py-spy, else the runtime's faulthandler signal) into LOG_DIR/dump-<time>/,
and this command prints the grouped summary it wrote there. The job keeps running.

A rank that cannot answer (stopped with SIGSTOP, or silent for the launcher's deadline) does not
hold the others back: their stacks are printed and it is named ("rank 1: no stack (did not
answer: pid N is stopped ...)"); the exit code is 0 whenever stacks were written, 1 when the
launcher wrote none within --timeout.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from fluidctl.errors import FluidctlError, UsageError
from fluidctl.paths import DEFAULT_LOG_DIR, LogLayout

EPILOG = """\b
Examples:
  fluidctl dump                      # the job started with the default --log-dir mylog
  fluidctl dump --log-dir runs/exp3 --timeout 120
"""


def _dump_dirs(root: Path):
    return {p for p in root.glob("dump-*") if (p / "summary.txt").exists()}


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True,
              help="The running job's --log-dir, e.g. --log-dir runs/exp3.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the stacks, e.g. --timeout 120.")
def dump(log_dir, timeout):
    """Print where every rank of a running job is (Python stacks, ranks grouped by stack);
    the full stacks go to LOG_DIR/dump-<time>/. The job keeps running. A rank that does not
    answer (stopped, hung in the kernel) is named and the others' stacks are printed: exit 0;
    exit 1 only when no stacks came within --timeout."""
    layout = LogLayout(Path(log_dir))
    try:
        state = json.loads(layout.job_state.read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"no running job in {log_dir} (no {layout.job_state})",
                         "pass the --log-dir the job was started with") from None
    host = state.get("host")
    if host and host != os.uname().nodename:
        job = state.get("slurm_job_id")
        there = (f"srun --jobid {job} --overlap -w {host} fluidctl dump --log-dir {log_dir}"
                 if job else f"ssh {host} fluidctl dump --log-dir {log_dir}")
        raise UsageError(f"the job in {log_dir} has its launcher on {host}, not on this machine",
                         f"run it there: {there}")
    before = _dump_dirs(layout.root)
    try:
        os.kill(pid, 0)
        from fluidctl.launch.run import DUMP_REQUEST
        os.kill(pid, DUMP_REQUEST)
    except ProcessLookupError:
        raise UsageError(f"the job in {log_dir} is not running any more (launcher pid {pid} "
                         "is gone)", "start it again, or look at its logs") from None
    except PermissionError:
        raise UsageError(f"may not signal the job's launcher (pid {pid})",
                         "run fluidctl dump as the user who started the job") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = _dump_dirs(layout.root) - before
        if new:
            where = max(new)
            click.echo((where / "summary.txt").read_text(), nl=False)
            click.echo(f"  every rank's full stack: {where}/")
            return
        time.sleep(0.1)
    raise FluidctlError(f"no stacks from the job in {log_dir} within {timeout:g}s",
                        f"see {layout.launch}; raise --timeout", exit_code=1)
