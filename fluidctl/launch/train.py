"""``fluidctl train``, without click: options in, one ``LaunchConfig`` (which checks them all),
``launch`` runs it and its exit code is the command's. The click command and any click-free
parser of train's plain forms call the same ``run``."""
from __future__ import annotations

import sys

from fluidctl.errors import UsageError

# the Slurm-only options (``--backend slurm``), gathered into one SlurmOptions
SLURM_NAMES = ("nodes", "partition", "time_limit", "account", "qos", "constraint", "exclude",
               "slurm_args", "job_name", "detach")


def slurm_options(options: dict):
    """Pop the Slurm options out of ``options``: (SlurmOptions, whether any was given)."""
    from fluidctl.planning.slurm import SlurmOptions
    values = {name: options.pop(name, None) for name in SLURM_NAMES}
    given = any(values.values())
    values["time"] = values.pop("time_limit")
    values["slurm_args"] = tuple(values["slurm_args"] or ())
    values["detach"] = bool(values["detach"])
    return SlurmOptions(**values), given


def run(dry_run: bool = False, as_json: bool = False, show_secrets: bool = False,
        **options) -> None:
    """Plan and run the job (``--dry-run``: print the plan); exits with the job's code.
    ``options`` are ``LaunchConfig.from_options``'s keywords plus the Slurm options."""
    if as_json and not dry_run:
        raise UsageError("--json only works with --dry-run", "add --dry-run")
    slurm, slurm_given = slurm_options(options)
    if slurm_given and options.get("backend") != "slurm":
        raise UsageError("--nodes, --partition, --time, ... are Slurm options",
                         "add --backend slurm")
    from fluidctl.planning.config import LaunchConfig
    config = LaunchConfig.from_options(slurm=slurm, **options)
    from fluidctl.launch.execute import launch
    sys.exit(launch(config, dry_run=dry_run, as_json=as_json, show_secrets=show_secrets))
