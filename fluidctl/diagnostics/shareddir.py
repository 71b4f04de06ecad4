"""Diagnostics of ranks that a backend's own launcher starts on other nodes (srun for Slurm,
mpirun for MPI): the hang watchdog's activity and the ranks' stacks, for ``--hang-timeout``
and ``fluidctl dump``. Imported only when such a job starts.

The job's diagnostics directory is made hidden in LOG_DIR, which these backends' nodes share
with the launcher (the ranks write their logs there too): the runtime's progress counters and
faulthandler files land there, and each rank's ``fluidctl worker`` writes ``rank.N`` (its node,
``DiagDir.this_node``, and its pid). The watchdog reads logs and counters from it as it does on
one machine. Stacks are taken on each node by ``fluidctl.node.stacks``, started once per
node by the backend's own launcher (``stack_takers(dir)``: an overlapping srun step, a second
mpirun), which answers in ``stacks.<node>.json``; they are merged here. On a network file
system what the ranks write to their logs is seen here with the client's caching delay
(seconds to a minute): give --hang-timeout minutes there; their counters and straggler sums
(``progress.N``, ``steps.N``, which the launcher's straggler watcher reads from here too) are
published within about a second (``fluidctl.diagnostics.pages``)."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from fluidctl.diagnostics.watch import Diagnostics, StackDump

STACKS_TIMEOUT = 60.0       # seconds for the stack takers (their launch, py-spy per rank)


class SharedDirDiagnostics(Diagnostics):
    """``stack_takers(diag_dir)``: the argv that runs the node-side stack taker once on every
    node of the job (with ``env``); ``world``: how many ranks there are."""

    def __init__(self, *, stack_takers: Callable[[str], List[str]], world: int,
                 log_root: Path, env: Optional[Mapping[str, str]] = None, **kw):
        from fluidctl.paths import DiagDir
        super().__init__(log_root=log_root, diag=DiagDir.create(Path(log_root).resolve()), **kw)
        self.stack_takers, self.world, self.takers_env = stack_takers, world, env

    def stacks(self, handles) -> StackDump:
        diag = self.diag
        for old in diag.root.glob("stacks.*.json"):       # an earlier dump's
            old.unlink()
        argv = self.stack_takers(str(diag.root))
        said, crashed = self._take(argv, STACKS_TIMEOUT)
        dump = StackDump()
        if crashed is not None and not any(diag.root.glob("stacks.*.json")):
            # Open MPI's second mpirun, started beside the job's, has died of SIGSEGV at
            # start with nothing on stderr (2 runs in about 20 of the suite): once more
            said, _ = self._take(argv, STACKS_TIMEOUT)
            dump.notes.append(f"the stack takers ({Path(argv[0]).name}) died of {crashed} and "
                              "were started again")
        answered = set()
        for path in sorted(diag.root.glob("stacks.*.json")):
            try:
                dump.merge(StackDump.from_json(json.loads(path.read_text())))
                answered.add(path.name[len("stacks."):-len(".json")])
            except (OSError, ValueError, KeyError):
                continue
        registered = diag.ranks()
        for rank in range(self.world):
            if rank in dump.texts or rank in dump.why:
                continue
            if rank not in registered:
                dump.why[rank] = "its fluidctl worker never registered"
            else:
                node = registered[rank][0]
                dump.why[rank] = f"its node ({node}) did not answer"
                dump.state[rank] = "unreachable"
                note = f"node {node}: no stacks ({said})"
                if node not in answered and note not in dump.notes:
                    dump.notes.append(note)
            dump.frames[rank] = None
        return dump

    def _take(self, argv: List[str], timeout: float) -> Tuple[str, Optional[str]]:
        """Run the stack takers: (their last word, the signal that killed them or None)."""
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=timeout, env=self.takers_env)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:g}s", None
        except OSError as exc:
            return f"{argv[0]}: {exc.strerror}", None
        said = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        crashed = None
        if res.returncode < 0:
            try:
                crashed = signal.Signals(-res.returncode).name
            except ValueError:
                crashed = f"signal {-res.returncode}"
        return said, crashed

    def hosts(self, handles) -> Dict[int, str]:
        return {rank: node for rank, (node, _) in self.diag.ranks().items()}
