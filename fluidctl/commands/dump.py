"""``fluidctl dump``: options and help only; the work (signal the running launcher, print the
stacks it writes) is ``fluidctl.diagnostics.dump.run``."""
from __future__ import annotations

import click

from fluidctl.commands.numbers import seconds
from fluidctl.paths import DEFAULT_LOG_DIR

EPILOG = """\b
Examples:
  fluidctl dump                      # the job started with the default --log-dir mylog
  fluidctl dump --log-dir runs/exp3 --timeout 120
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True,
              help="The running job's --log-dir, e.g. --log-dir runs/exp3.")
@click.option("--timeout", type=seconds(0.1, 86400, "--timeout 120"), default=60.0,
              show_default=True,
              help="Seconds to wait for the stacks, e.g. --timeout 120.")
def dump(log_dir, timeout):
    """Print where every rank of a running job is (Python stacks, ranks grouped by stack);
    the full stacks go to LOG_DIR/dump-<time>/. The job keeps running. A rank that does not
    answer (stopped, hung in the kernel) is named and the others' stacks are printed: exit 0;
    exit 1 only when no stacks came within --timeout."""
    from fluidctl.diagnostics.dump import run
    run(log_dir, timeout)
