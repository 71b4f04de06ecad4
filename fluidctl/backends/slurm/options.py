"""The Slurm-only options of ``fluidctl train`` (``--backend slurm``), declared once (fastargs
Options: names, type, help); ``plan.py`` parses them, and Slurm's meaning of the shared
``--nodes`` (a node count), into one ``SlurmOptions``."""
from __future__ import annotations

from fluidctl import fastargs

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
