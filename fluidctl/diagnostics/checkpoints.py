"""A pserver's checkpoint failures, as its log says them and the launcher reads them back: the
one contract between ``runtime/pserver/server.py`` (which writes the lines) and the launcher
(``launch/execute.py``, which warns on the console and in launch.log, and fails the job when
the final checkpoint could not be saved). Standard library only: the launcher imports it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

_LINE = re.compile(r"\b(final )?checkpoint at step (\d+) failed in (.+?): (.*)$")


def failed_line(step: int, directory: str, error: str, final: bool = False) -> str:
    """What the pserver logs when writing a checkpoint failed."""
    return f"{'final ' if final else ''}checkpoint at step {step} failed in {directory}: {error}"


@dataclass
class CheckpointFailures:
    count: int = 0
    first: str = ""             # "step 11: [Errno 28] No space left on device"
    directory: str = ""
    final: Optional[str] = None     # the final checkpoint's failure, when it failed

    def __bool__(self) -> bool:
        return self.count > 0


def scan(log_path: str) -> CheckpointFailures:
    """Every checkpoint failure a pserver's log records."""
    found = CheckpointFailures()
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = _LINE.search(line.rstrip("\n"))
                if not m:
                    continue
                final, step, directory, error = m.groups()
                found.count += 1
                found.directory = directory
                if not found.first:
                    found.first = f"step {step}: {error}"
                if final:
                    found.final = f"step {step}: {error}"
    except OSError:
        pass
    return found


def report(pservers: List[tuple], say, log) -> bool:
    """Warn about every pserver whose checkpoints failed (``pservers``: [(label, log path)]);
    True when a pserver's final checkpoint could not be saved."""
    final_failed = False
    for label, path in pservers:
        found = scan(path)
        if not found:
            continue
        line = (f"warning: {label}: {found.count} checkpoint(s) failed in {found.directory} "
                f"(first at {found.first}); see {path}")
        say(f"fluidctl: {line}")
        log(line)
        if found.final is not None:
            final_failed = True
            line = (f"error: {label} could not save its final checkpoint ({found.final}): "
                    "what it learnt since its last good checkpoint is not on disk (free space "
                    "in the checkpoint dir, or pass another --checkpoint-dir)")
            say(f"fluidctl: {line}")
            log(line)
    return final_failed
