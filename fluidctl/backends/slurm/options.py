"""The Slurm-only options of ``fluidctl train`` (``--backend slurm``), declared once (fastargs
Options: names, type, help), and Slurm's meaning of the shared ``--nodes`` (a node count),
parsed into one ``SlurmOptions`` for the backend."""
from __future__ import annotations

import dataclasses

from fluidctl import fastargs
from fluidctl.errors import UsageError

OPTIONS = (
    fastargs.Option(["--partition"], "partition",
                    help="slurm: the partition to submit to, e.g. --partition gpu."),
    fastargs.Option(["--time"], "time_limit",
                    help="slurm: the job's time limit, e.g. --time 04:00:00."),
    fastargs.Option(["--account"], "account",
                    help="slurm: account to charge, e.g. --account proj1."),
    fastargs.Option(["--qos"], "qos", help="slurm: quality of service, e.g. --qos high."),
    fastargs.Option(["--constraint"], "constraint",
                    help="slurm: node features required, e.g. --constraint 'a100&ib'."),
    fastargs.Option(["--exclude"], "exclude",
                    help="slurm: nodes not to use, e.g. --exclude 'gpu[003-004]'."),
    fastargs.Option(["--slurm-arg"], "slurm_args", fastargs.MULTI, metavar="ARG",
                    help="slurm: passed as it is (repeatable): an #SBATCH line when "
                         "submitting, an srun option inside an allocation, e.g. "
                         "--slurm-arg=--mail-type=END."),
    fastargs.Option(["--checkpoint-warning"], "checkpoint_warning",
                    type=fastargs.int_at_least(1), metavar="SECONDS",
                    help="slurm: SECONDS before --time ends, ask every rank for a checkpoint "
                         "(#SBATCH --signal=B:USR1@SECONDS), then requeue the job "
                         "(#SBATCH --requeue); inside an allocation, SECONDS before its end, "
                         "e.g. --checkpoint-warning 120."),
    fastargs.Option(["--detach"], "detach", fastargs.FLAG,
                    help="slurm, from a login node: return once submitted instead of "
                         "following the job (then: fluidctl job logs JOB -f)."),
)


def configure(config, values: dict):
    """``config`` with its ``SlurmOptions``; the allocation, not a hostfile, gives the nodes."""
    from fluidctl.backends.slurm.plan import SlurmOptions
    from fluidctl.planning.elastic import node_count
    nodes = node_count(values.pop("nodes", None), "slurm")
    if config.gpus == "all":
        raise UsageError("--gpus all is not known with --backend slurm",
                         "give a count per node, e.g. --gpus 4")
    if values.get("health_gate"):
        raise UsageError("--health-gate measures the nodes of --hostfile/--hosts over SSH; "
                         "under Slurm the allocation chooses them",
                         "drop --health-gate (run fluidctl cluster check --deep on the "
                         "allocation's nodes), or pass --exclude")
    options = SlurmOptions(
        nodes=nodes, partition=values.pop("partition", None), time=values.pop("time_limit", None),
        account=values.pop("account", None), qos=values.pop("qos", None),
        constraint=values.pop("constraint", None), exclude=values.pop("exclude", None),
        slurm_args=tuple(values.pop("slurm_args", None) or ()),
        detach=bool(values.pop("detach", False)), job_name=values.pop("job_name", None),
        checkpoint_warning=values.pop("checkpoint_warning", None))
    return dataclasses.replace(config, backend_options=options)
