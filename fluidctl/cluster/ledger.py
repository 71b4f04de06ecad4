"""The ledger of bad nodes: which node, when, why (lost, failed the health gate, ranks crashed
with a hardware-looking signal), and until when it is left out. Elastic restarts, later attempts
and later jobs skip a ledgered node unless told (``--include-bad``), so a retry does not land on
the node that broke the last one. One JSON file (paths.bad_nodes_ledger), written atomically
under a lock, so concurrent jobs of one user can record at once.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from fluidctl import paths

DEFAULT_EXCLUDE_S = 3600.0              # how long a node stays out unless the caller says

# why a node is in the ledger
LOST = "lost"                           # its agent stopped answering, its link went down
HEALTH = "health"                       # failed the health gate (an outlier among its peers)
CRASHED = "crashed"                     # its ranks died of a hardware-looking signal (SIGBUS...)
STEP_FAILED = "step-failed"             # a Slurm step failed on it


@dataclass
class Entry:
    host: str
    why: str                            # LOST, HEALTH, CRASHED, STEP_FAILED
    detail: str                         # one line: the evidence ("no heartbeat for 3.0 s")
    since: float                        # time.time() it was recorded
    until: float                        # time.time() it is excluded until
    job: str = ""                       # the job that saw it, when known

    def active(self, now: Optional[float] = None) -> bool:
        return (time.time() if now is None else now) < self.until


@contextmanager
def _locked():
    path = paths.bad_nodes_ledger()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


def _read(path) -> Dict[str, Entry]:
    try:
        raw = json.loads(open(path).read() or "{}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}                       # a damaged ledger must never stop a job
    out = {}
    for host, item in (raw.get("nodes") or {}).items():
        try:
            out[host] = Entry(**item)
        except TypeError:
            continue
    return out


def _write(path, entries: Dict[str, Entry]) -> None:
    paths.write_atomic(path, json.dumps({"nodes": {h: asdict(e) for h, e in entries.items()}},
                                        indent=1, sort_keys=True) + "\n", mode=0o600)


def record(host: str, why: str, detail: str, exclude_s: float = DEFAULT_EXCLUDE_S,
           job: str = "") -> Entry:
    """Put ``host`` in the ledger (or renew its entry) for ``exclude_s`` seconds."""
    now = time.time()
    entry = Entry(host, why, detail, now, now + exclude_s, job)
    with _locked() as path:
        entries = _read(path)
        entries[host] = entry
        _write(path, entries)
    return entry


def entries(include_expired: bool = False) -> List[Entry]:
    with _locked() as path:
        found = _read(path)
    now = time.time()
    return sorted((e for e in found.values() if include_expired or e.active(now)),
                  key=lambda e: e.since)


def excluded(hosts: Iterable[str]) -> Dict[str, Entry]:
    """The ledger's active entries among ``hosts`` (a plan's nodes)."""
    active = {e.host: e for e in entries()}
    return {h: active[h] for h in hosts if h in active}


def clear(host: Optional[str] = None) -> List[str]:
    """Remove ``host``'s entry, or every entry; returns the hosts removed."""
    with _locked() as path:
        found = _read(path)
        gone = [h for h in found if host is None or h == host]
        for h in gone:
            del found[h]
        _write(path, found)
    return gone



def usable(names: Sequence[str], min_count: int, include_bad: bool = False,
           say: Optional[Callable[[str], None]] = None) -> List[str]:
    """``names`` (a job's candidate nodes) without the active entries, unless ``include_bad``;
    ``say`` hears one line naming those left out, why, and how to include them. A UsageError
    when fewer than ``min_count`` are left."""
    bad = {} if include_bad else excluded(names)
    if not bad:
        return list(names)
    from fluidctl.errors import UsageError
    left = [n for n in names if n not in bad]
    if len(left) < min_count:
        raise UsageError(f"{len(bad)} of {len(names)} node(s) are in the bad-node ledger "
                         f"({', '.join(bad)}): {len(left)} left, {min_count} required",
                         "pass --include-bad to use them, or forget them with "
                         "fluidctl cluster ledger clear HOST")
    if say:
        say(f"note: leaving out {len(bad)} node(s) in the bad-node ledger: "
            + "; ".join(f"{h} ({describe(e)})" for h, e in bad.items())
            + " (--include-bad uses them; fluidctl cluster ledger clear HOST forgets them)")
    return left


def describe(entry: Entry) -> str:
    """'why, evidence' in one phrase."""
    return f"{entry.why}, {entry.detail}" if entry.detail else entry.why
