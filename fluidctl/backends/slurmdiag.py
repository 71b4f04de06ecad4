"""Diagnostics of a job run as srun steps inside an allocation (``--backend slurm``): the hang
watchdog's activity and the ranks' stacks, for ``--hang-timeout`` and ``fluidctl dump``.
Imported only when such a job starts."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Dict

from fluidctl.backends.slurm import srun_argv, step_name
from fluidctl.diagnose import Diagnostics, StackDump

if TYPE_CHECKING:
    from fluidctl.backends.slurm import SlurmLauncher

STACKS_TIMEOUT = 60.0       # seconds for the stack-taking step (srun start-up, py-spy per rank)


class SlurmDiagnostics(Diagnostics):
    """``--hang-timeout`` and ``fluidctl dump`` for ranks on the allocation's nodes. Their
    diagnostics directory is made in LOG_DIR, which the nodes share with the launcher under
    Slurm (the ranks write their logs there too): the progress counters and each rank's
    ``rank.N`` (node, pid) are read from it. Stacks are taken on each node by
    ``fluidctl.launch.nodestacks``, one task per node in an overlapping srun step, which
    answers in ``stacks.<node>.json``. On a network file system, what the ranks write is seen
    here with the client's caching delay (seconds to a minute): give --hang-timeout minutes."""

    def __init__(self, launcher: "SlurmLauncher", *, log_root: Path, **kw):
        from fluidctl.paths import DiagDir
        super().__init__(log_root=log_root, diag=DiagDir.create(Path(log_root).resolve()), **kw)
        self.launcher = launcher

    def stacks(self, handles) -> StackDump:
        launcher, diag = self.launcher, self.diag
        for old in diag.root.glob("stacks.*.json"):       # an earlier dump's
            old.unlink()
        argv = srun_argv(nodes=len(launcher.nodes), ntasks_per_node=1, name=step_name(),
                         command=[launcher.python, "-m", "fluidctl.launch.nodestacks",
                                  str(diag.root)],
                         nodelist=launcher.nodes, overlap=True, fail_fast=False)
        dump = StackDump()
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=STACKS_TIMEOUT)
            said = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            said = f"no answer within {STACKS_TIMEOUT:g}s"
        except OSError as exc:
            said = f"srun: {exc.strerror}"
        for node in launcher.nodes:
            try:
                record = json.loads(diag.node_stacks(node).read_text())
            except (OSError, ValueError):
                dump.notes.append(f"node {node}: no stacks ({said})")
                continue
            dump.merge(StackDump.from_json(record))
        registered = diag.ranks()
        for rank in range(launcher.world):
            if rank in dump.texts or rank in dump.why:
                continue
            dump.why[rank] = ("its fluidctl worker never registered" if rank not in registered
                              else f"its node ({registered[rank][0]}) did not answer")
            dump.frames[rank] = None
        return dump

    def hosts(self, handles) -> Dict[int, str]:
        return {rank: node for rank, (node, _) in self.diag.ranks().items()}
