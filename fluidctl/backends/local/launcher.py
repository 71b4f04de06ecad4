"""``--backend local``: every process of the job on this machine (the processes themselves are
``fluidctl.procs.local``'s)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

from fluidctl.backends.base import BaseLauncher
from fluidctl.errors import UsageError
from fluidctl.procs.local import LocalProcess, start_procs

if TYPE_CHECKING:
    from fluidctl.planning.config import LaunchConfig
    from fluidctl.planning.plan import Plan


class LocalLauncher(BaseLauncher):
    """``--backend local``: every process on this machine. Ports are reserved (bound) while
    planning and released right after the processes that use them have started."""
    name = "local"

    def __init__(self, log=None):
        super().__init__(log)
        self._reservation = None

    def prepare(self, config: "LaunchConfig") -> "Plan":
        from fluidctl.net import PortReservation
        from fluidctl.planning import devices, plan as planner
        if config.hosts:
            raise UsageError("--backend local runs on this machine only",
                             "drop --hostfile/--hosts, or use --backend ssh|fabric|mpi")
        available = (devices.discover_gpus(os.environ)
                     if planner.wants_gpus(config.nproc, config.gpus) else [])
        node = planner.local_node(config.nproc, config.gpus, config.mode, config.pservers,
                                  config.pserver_endpoints, available)
        job = config.job([node])
        self._reservation = PortReservation(node.address, job.ports_needed(0),
                                            config.started_port)
        return planner.make_plan(job, {0: self._reservation.ports}, backend=self.name)

    def start(self, plan: "Plan", attempt: int) -> List[LocalProcess]:
        handles = start_procs(plan.procs, attempt, extra_env=self.diag_env())
        self.close()                        # the processes hold their ports now
        return handles

    def close(self) -> None:
        if self._reservation is not None:
            self._reservation.release()
