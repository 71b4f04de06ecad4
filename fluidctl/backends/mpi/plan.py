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
    if not config.hosts:
        from fluidctl.planning.nodeopts import refuse_without_nodes
        refuse_without_nodes(config, bool(values.get("include_bad")),
                             "--backend mpi without them runs mpirun on this machine")
    if config.remote_dir:
        raise UsageError("--remote-dir is not passed to mpirun (its ranks start in this "
                         "directory's path on every node)", "use --mpirun-arg=--wdir=DIR")
    if config.started_port:
        raise UsageError("--started-port: the ranks under mpirun choose their endpoints when "
                         "they start", "drop --started-port")
    args = tuple(values.pop("mpirun_args", None) or ())
    return dataclasses.replace(config, backend_options=MpiOptions(nodes.count,
                                                                  mpirun_args=args))
