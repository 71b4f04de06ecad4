"""``fluidctl train``: options and help only; ``fluidctl.launch.train.run`` does the rest.

Checking and freezing the options is ``LaunchConfig.from_options``; the backend (``--backend``,
a name in ``fluidctl.backends`` registry) plans and starts; ``launch.execute`` supervises and
reports. Every option is declared once, in ``fluidctl.trainargs`` (a backend's own in its
package, ``fluidctl/backends/<name>/options.py``); this command is built from that table, and
the plain forms are parsed with it, without click, by ``fluidctl.fastargs`` (a fifth of the
launcher's start-up is click).
"""
from __future__ import annotations

import click

from fluidctl import backends, trainargs
from fluidctl.commands import fastoptions

CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"],
           "max_content_width": 100}

EPILOG = """\b
Examples:
  fluidctl train --nproc 2 templates/train_nccl2.py --epochs 3
  fluidctl train --gpus 0,2,3 train.py
  fluidctl train --mode pserver --pservers 2 --nproc 2 templates/train_pserver.py
  fluidctl train --nproc 4 --dry-run --json train.py
"""


@click.command(context_settings=CONTEXT, epilog=EPILOG)
@fastoptions.options(trainargs.options(backends.every()))
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def train(**params):
    """Run SCRIPT as a distributed training job.

    SCRIPT ending in .py runs with fluidctl's own Python (-u); anything else is executed.
    SCRIPT_ARGS are passed to it untouched, options included.
    """
    from fluidctl.launch.train import run
    run(**params)
