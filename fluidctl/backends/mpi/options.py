"""``--backend mpi``'s own option, declared once (a fastargs Option): ``--mpirun-arg``;
``plan.py`` parses it."""
from __future__ import annotations

from fluidctl import fastargs

OPTIONS = (
    fastargs.Option(["--mpirun-arg"], "mpirun_args", fastargs.MULTI, metavar="ARG",
                    help="mpi: passed to mpirun as it is (repeatable), e.g. "
                         "--mpirun-arg=--oversubscribe --mpirun-arg='--mca btl ^openib'."),
)
