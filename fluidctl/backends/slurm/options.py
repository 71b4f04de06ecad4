"""The Slurm-only options of ``fluidctl train`` (``--backend slurm``), as one decorator, so the
train command carries them in one line; ``fluidctl.launch.train.slurm_options`` gathers them
into one ``SlurmOptions`` for the backend."""
from __future__ import annotations

import click

OPTIONS = (
    click.option("--nodes", "--nnodes", "nodes", default=None, metavar="N|MIN:MAX",
                 help="slurm: nodes to run on (default inside an allocation: all of its nodes; "
                      "required to submit from a login node), e.g. --nodes 2. Without "
                      "slurm, the nodes are --hostfile's; --nodes N then runs on the "
                      "first N of them that are not in the bad-node ledger (the rest are "
                      "spares), and a range makes an elastic job (ssh, fabric): it runs on at "
                      "most MAX of them, the others are spares, and it goes on while MIN are "
                      "left, e.g. --nodes 2:4 --max-restarts 3."),
    click.option("--partition", default=None,
                 help="slurm: the partition to submit to, e.g. --partition gpu."),
    click.option("--time", "time_limit", default=None,
                 help="slurm: the job's time limit, e.g. --time 04:00:00."),
    click.option("--account", default=None, help="slurm: account to charge, e.g. --account proj1."),
    click.option("--qos", default=None, help="slurm: quality of service, e.g. --qos high."),
    click.option("--constraint", default=None,
                 help="slurm: node features required, e.g. --constraint 'a100&ib'."),
    click.option("--exclude", default=None,
                 help="slurm: nodes not to use, e.g. --exclude 'gpu[003-004]'."),
    click.option("--slurm-arg", "slurm_args", multiple=True, metavar="ARG",
                 help="slurm: passed as it is (repeatable): an #SBATCH line when submitting, an "
                      "srun option inside an allocation, e.g. --slurm-arg=--mail-type=END."),
    click.option("--mpirun-arg", "mpirun_args", multiple=True, metavar="ARG",
                 help="mpi: passed to mpirun as it is (repeatable), e.g. "
                      "--mpirun-arg=--oversubscribe --mpirun-arg='--mca btl ^openib'."),
    click.option("--job-name", default=None,
                 help="slurm: the job's name (default: the script's name), e.g. --job-name bert."),
    click.option("--checkpoint-warning", type=click.IntRange(1), default=None, metavar="SECONDS",
                 help="slurm: SECONDS before --time ends, ask every rank for a checkpoint "
                      "(#SBATCH --signal=B:USR1@SECONDS), then requeue the job "
                      "(#SBATCH --requeue); inside an allocation, SECONDS before its end, "
                      "e.g. --checkpoint-warning 120."),
    click.option("--detach", is_flag=True,
                 help="slurm, from a login node: return once submitted instead of following "
                      "the job (then: fluidctl job logs JOB -f)."),
)


def slurm_options(f):
    for option in reversed(OPTIONS):
        f = option(f)
    return f
