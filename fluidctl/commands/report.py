"""``fluidctl report``: options and help only; the work is ``fluidctl.report.make.run``."""
from __future__ import annotations

import click

EPILOG = """\b
Examples:
  fluidctl report mylog                       # writes mylog/report.html
  fluidctl report runs/exp3 -o exp3.html --png exp3-plots/
  fluidctl report 1234                        # a Slurm job submitted from here
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("job")
@click.option("-o", "--output", default=None, metavar="FILE.html",
              help="Where to write the page (default: report.html in the job's log dir), "
                   "e.g. -o exp3.html.")
@click.option("--png", "png_dir", default=None, metavar="DIR",
              help="Also write each plot as a PNG into DIR (made if needed), e.g. --png plots/.")
def report(job, output, png_dir):
    """One self-contained HTML page about a job, running or ended: the timeline (attempts,
    restarts, elastic worlds, lost nodes, checkpoints, preemptions, stragglers, hangs), each
    rank's step time over time, a straggler heat map (rank x time), the failure or hang
    report, and the plan. It needs no network to view. JOB: the job's --log-dir, or a Slurm
    job id submitted from here (fluidctl job list). Needs matplotlib (pip install
    'fluidctl[report]')."""
    from fluidctl.report.make import run
    run(job, output, png_dir)
