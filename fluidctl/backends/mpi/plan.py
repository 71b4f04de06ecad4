"""``--backend mpi``'s piece of the plan: its options parsed (``--mpirun-arg``, and the shared
``--nodes`` as a count of --hostfile's nodes) into ``MpiOptions``; what mpirun cannot do is
refused here."""
from __future__ import annotations

import dataclasses
from typing import Tuple

from fluidctl.errors import UsageError
from fluidctl.planning.elastic import HostNodes, host_nodes


@dataclasses.dataclass(frozen=True)
class MpiOptions(HostNodes):
    """``--backend mpi``'s options: ``count`` of --hostfile's nodes to use (None: all) and
    what --mpirun-arg passes to mpirun."""
    mpirun_args: Tuple[str, ...] = ()


def configure(config, values: dict):
    nodes = host_nodes(values.pop("nodes", None), len(config.hosts), config.mode)
    if config.tee_ranks is not None:
        raise UsageError("--tee-ranks needs fluidctl's own supervision of every rank "
                         "(mpirun forwards the remote ranks' output as one stream)",
                         "use --tee all, or --backend local, ssh, fabric or slurm")
    if config.gpus == "all":
        raise UsageError("--gpus all is not known with --backend mpi",
                         "give a count per node, e.g. --gpus 4")
    args = tuple(values.pop("mpirun_args", None) or ())
    return dataclasses.replace(config, backend_options=MpiOptions(nodes.count,
                                                                  mpirun_args=args))
