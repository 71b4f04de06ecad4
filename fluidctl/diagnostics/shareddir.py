"""Diagnostics of ranks that a backend's own launcher starts on other nodes (srun for Slurm,
mpirun for MPI): the hang watchdog's activity and the ranks' stacks, for ``--hang-timeout``
and ``fluidctl dump``. Imported only when such a job starts.

The job's diagnostics directory is made hidden in LOG_DIR, which these backends' nodes share
with the launcher (the ranks write their logs there too): the runtime's progress counters and
faulthandler files land there, and each rank's ``fluidctl worker`` writes ``rank.N`` (its node,
``DiagDir.this_node``, and its pid). The watchdog reads logs and counters from it as it does on
one machine. Stacks are taken on each node by ``fluidctl.node.stacks``, which answers in
``stacks.<node>.json``; they are merged here. ``stack_takers(dir)`` says the commands that
start it, run side by side: one overlapping srun step (one task per node) for Slurm; for
mpirun, this machine's taker and one ssh per node, as mpirun's own daemons were reached (a
second mpirun beside the job's has died of SIGSEGV, or exited 255 with nothing said, about one
time in six on a loaded machine). On a network file
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

from fluidctl.diagnostics.failures import signal_of
from fluidctl.diagnostics.watch import Diagnostics, StackDump

STACKS_TIMEOUT = 60.0       # seconds for the stack takers (their launch, py-spy per rank)


class SharedDirDiagnostics(Diagnostics):
    """``stack_takers(diag_dir)``: the argvs that, run side by side (with ``env``), run the
    node-side stack taker once on every node of the job; ``world``: how many ranks there
    are."""

    def __init__(self, *, stack_takers: Callable[[str], List[List[str]]], world: int,
                 log_root: Path, env: Optional[Mapping[str, str]] = None, **kw):
        from fluidctl.paths import DiagDir
        super().__init__(log_root=log_root, diag=DiagDir.create(Path(log_root).resolve()), **kw)
        self.stack_takers, self.world, self.takers_env = stack_takers, world, env

    def stacks(self, handles) -> StackDump:
        diag = self.diag
        for old in diag.root.glob("stacks.*.json"):       # an earlier dump's
            old.unlink()
        argvs = self.stack_takers(str(diag.root))
        said = self._take(argvs, STACKS_TIMEOUT)
        dump = StackDump()
        again = [i for i, (_, crashed) in enumerate(said) if crashed is not None]
        if again:
            # a taker that died of a signal (a launcher's, at its start): once more, and the
            # report says so
            for i, retry in zip(again, self._take([argvs[i] for i in again], STACKS_TIMEOUT)):
                dump.notes.append(f"the stack takers ({Path(argvs[i][0]).name}) died of "
                                  f"{said[i][1]} and were started again")
                said[i] = retry
        words = list(dict.fromkeys(word for word, _ in said if word))
        last_word = "; ".join(words[:3]) + ("; ..." if len(words) > 3 else "") or "no answer"
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
                note = f"node {node}: no stacks ({last_word})"
                if node not in answered and note not in dump.notes:
                    dump.notes.append(note)
            dump.frames[rank] = None
        return dump

    def _take(self, argvs: List[List[str]], timeout: float
              ) -> List[Tuple[str, Optional[str]]]:
        """Run the takers side by side within ``timeout`` (a taker still running then is
        killed, with its process group): for each, (its last word or '' when it succeeded,
        the signal that killed it or None)."""
        import os
        import time
        procs: List[Optional[subprocess.Popen]] = []
        out: List[Tuple[str, Optional[str]]] = []
        for argv in argvs:
            try:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              text=True, env=self.takers_env,
                                              start_new_session=True))
                out.append(("", None))
            except OSError as exc:
                procs.append(None)
                out.append((f"{argv[0]}: {exc.strerror}", None))
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(procs):
            if proc is None:
                continue
            try:
                err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))[1]
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.communicate()
                out[i] = (f"no answer within {timeout:g}s", None)
                continue
            if proc.returncode == 0:
                continue
            word = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            out[i] = (word, signal_of(proc.returncode) if proc.returncode < 0 else None)
        return out

    def hosts(self, handles) -> Dict[int, str]:
        return {rank: node for rank, (node, _) in self.diag.ranks().items()}
