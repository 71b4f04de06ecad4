"""``fluidctl worker SCRIPT [ARGS]``, the click command: its help and the odd forms (an
option before SCRIPT, no SCRIPT). The plain form never gets here: ``fluidctl.cli.main`` runs
``fluidctl.node.worker.run`` without importing click; this command calls the same ``run``."""
from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False},
               help="""Run SCRIPT as one rank of a job started by mpirun or srun.

Maps OpenMPI's OMPI_COMM_WORLD_* variables, or Slurm's SLURM_PROCID / LOCALID / NODEID /
NTASKS / JOB_NODELIST, to the PADDLE_* contract (rank, size, endpoints, master), then runs
SCRIPT with that environment and exits with its code. A Python script runs
in the worker's own process and keeps mpirun's MPI world (mpi4py sees every rank); any other
program runs as a child without MPI's variables (MPI programs are refused: run them with
mpirun directly). With FLUIDCTL_LOG_DIR set, the output is also written to
FLUIDCTL_LOG_DIR/workerlog.RANK. With FLUIDCTL_GPUS=all (or a --gpus value such as 4 or 0,2),
local rank i runs on the node's i-th GPU.

\b
Example:
  mpirun -np 4 -hostfile machines fluidctl worker train.py --epochs 3
  srun -N 2 --ntasks-per-node=4 fluidctl worker train.py --epochs 3""")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(script, args):
    from fluidctl.node.worker import run
    run(script, list(args))
