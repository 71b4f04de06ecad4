"""A node agent's report of its ranks' CPU%, RSS and GPU use (psutil, NVML where there): one
``usage`` line every ``EVERY`` seconds, so ``fluidctl top`` and the metrics endpoint show the
ranks of every node, not only those on the launcher's host. The agent reads /proc for its own
children; the ranks do nothing new."""
from __future__ import annotations

import json
import threading
from typing import Callable, Dict, List

EVERY = 2.0             # seconds between usage lines


def sample(procs, handles: List) -> Dict[str, dict]:
    """rank -> {cpu, rss[, gpu...]} of the running trainers among ``handles``."""
    out = {}
    for handle in handles:
        rank, pid = getattr(handle, "rank", None), getattr(handle, "pid", None)
        if rank is None or not pid or handle.poll() is not None:
            continue
        found = procs.usage(pid)
        if found:
            out[str(rank)] = found
    return out


def publish(handles: Callable[[], List], emit: Callable[[str], None], halt: threading.Event,
            every: float = EVERY) -> None:
    """The agent's loop: a ``usage`` line (JSON) while its ranks run."""
    from fluidctl.observe.snapshot import Procs
    procs = Procs()
    while not halt.wait(every):
        try:
            found = sample(procs, handles())
            if found:
                emit(json.dumps(found, separators=(",", ":")))
        except (OSError, ValueError):       # the launcher is gone
            return
        except Exception:       # noqa: BLE001 - a report must never stop the node's ranks
            continue
