"""Backends: how a planned job's processes are started (local, ssh, fabric, mpi, ...).

``LAUNCHERS`` is the registry: --backend name -> "module:LauncherClass" (imported only when
used, so ``fluidctl train`` on one machine never imports paramiko). A new backend is one module
implementing ``fluidctl.backends.base.Launcher`` and one line here.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Callable, List, Optional

LAUNCHERS = {
    "local": "fluidctl.backends.local:LocalLauncher",
    "ssh": "fluidctl.backends.ssh:SSHLauncher",
    "fabric": "fluidctl.backends.ssh:FabricLauncher",
    "mpi": "fluidctl.backends.mpi:MPILauncher",
    "slurm": "fluidctl.backends.slurm:SlurmLauncher",
    "k8s": "fluidctl.backends.k8s:K8sLauncher",
}


def names() -> List[str]:
    return list(LAUNCHERS)


def launcher(name: str, log: Optional[Callable[[str], None]] = None):
    """A new Launcher for ``--backend name``; ``log`` receives its launch.log lines."""
    import importlib        # here: cluster sync imports this package and needs none of it
    module, _, cls = LAUNCHERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(log)
