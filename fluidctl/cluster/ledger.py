"""The ledger of bad nodes: which node, when, why (lost, failed the health gate, ranks crashed
with a hardware signal), and until when it is left out. Elastic restarts, later attempts and
later jobs skip a ledgered node unless told (``--include-bad``), so a retry does not land on
the node that broke the last one. One JSON file (paths.bad_nodes_ledger), written atomically
under a lock, so concurrent jobs of one user can record at once.

A node is ledgered only on evidence about the node itself (docs/blame.md): its agent lost, a
failed health gate, a hardware signal (SIGBUS) its ranks died of, Slurm saying the node
failed. A rank's exit code or a SIGKILL of ranks is the job's, never the node's.

Entries are keyed by the node's identity (``identity``: the address it is reached at and the
SSH port), not by the alias a hostfile gives it, so two clusters' "node4" are two nodes; the
alias is kept for people. Files keyed by alias alone still read (their entries match by alias).

The file is state, not input: an unreadable file or entry is a warning and is read as absent;
it is never silently replaced (a whole damaged file is set aside beside it before a write,
damaged entries are written back as they were).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from fluidctl import paths

DEFAULT_EXCLUDE_S = 3600.0              # how long a node stays out unless the caller says

# why a node is in the ledger
LOST = "lost"                           # its agent stopped answering, its link went down
HEALTH = "health"                       # failed the health gate (an outlier among its peers)
CRASHED = "crashed"                     # its ranks died of a hardware signal (SIGBUS)
STEP_FAILED = "step-failed"             # Slurm said the node failed under a step


@dataclass
class Entry:
    host: str                           # the alias people know it by
    why: str                            # LOST, HEALTH, CRASHED, STEP_FAILED
    detail: str                         # one line: the evidence ("no heartbeat for 3.0 s")
    since: float                        # time.time() it was recorded
    until: float                        # time.time() it is excluded until
    job: str = ""                       # the job that saw it, when known
    node: str = ""                      # its identity (``identity``); "" in an old file

    def active(self, now: Optional[float] = None) -> bool:
        return (time.time() if now is None else now) < self.until

    @property
    def key(self) -> str:
        return self.node or self.host


def identity(host) -> str:
    """A node's key: "ADDRESS:PORT" for a Host (its resolved address, the SSH port, 22 when
    none is set), the name itself for a plain name (a Slurm node name)."""
    if isinstance(host, str):
        return host
    return f"{host.address.lower()}:{host.port or 22}"


def _name(host) -> str:
    return host if isinstance(host, str) else host.name


class _Book:
    """What the file held: its readable entries by key, the unreadable ones as they were
    (kept on rewrite), and ``damaged``: why the whole file could not be read ("" when it
    could)."""
    def __init__(self):
        self.entries: Dict[str, Entry] = {}
        self.raw_bad: Dict[str, object] = {}
        self.damaged = ""


_warned = set()


def _warn(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        print(f"warning: {text}", file=sys.stderr, flush=True)


def _entry(key: str, item) -> Entry:
    """``item`` as an Entry, or ValueError saying what is wrong with it."""
    if not isinstance(item, dict):
        raise ValueError(f"a {type(item).__name__}, not an object")
    names = {f.name for f in fields(Entry)}
    if not {"host", "why", "since", "until"} <= set(item) or set(item) - names:
        raise ValueError("not the fields of an entry (host, why, detail, since, until, job)")
    for name in ("host", "why", "detail", "job", "node"):
        if not isinstance(item.get(name, ""), str):
            raise ValueError(f"{name} is not a string")
    for name in ("since", "until"):
        value = item[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{name} is {json.dumps(value)}, not a time in seconds")
    return Entry(**{**item, "since": float(item["since"]), "until": float(item["until"])})


def _read(path) -> _Book:
    book = _Book()
    try:
        raw = json.loads(paths.read_state_file(path).decode("utf-8") or "{}")
    except FileNotFoundError:
        return book
    except paths.StateFileError as exc:     # a FIFO or a device there must not hang a read
        book.damaged = str(exc)
    except (OSError, ValueError) as exc:
        book.damaged = f"not readable JSON ({exc})"
    else:
        if not isinstance(raw, dict) or not isinstance(raw.get("nodes", {}), dict):
            book.damaged = 'not a JSON object with a "nodes" object'
    if book.damaged:
        _warn(f"the bad-node ledger {path} is damaged: {book.damaged}; read as empty")
        return book
    for key, item in (raw.get("nodes") or {}).items():
        try:
            entry = _entry(key, item)
        except ValueError as exc:
            _warn(f"the bad-node ledger {path}: entry {key!r} left aside ({exc})")
            book.raw_bad[key] = item
            continue
        book.entries[entry.key] = entry
    return book


def _write(path, book: _Book) -> None:
    if book.damaged:        # keep the user's file: set it aside, say where
        aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(path, aside)
        _warn(f"the damaged bad-node ledger was moved to {aside}; a new one starts")
        book.damaged = ""
    nodes = {**book.raw_bad, **{k: asdict(e) for k, e in book.entries.items()}}
    paths.write_atomic(path, json.dumps({"nodes": nodes}, indent=1, sort_keys=True) + "\n",
                       mode=0o600)


@contextmanager
def _locked():
    path = paths.bad_nodes_ledger()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = str(path) + ".lock"
    try:
        fd = paths.open_state_file(lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except paths.StateFileError as exc:
        from fluidctl.errors import UsageError
        raise UsageError(f"the bad-node ledger's lock: {exc}",
                         f"remove it (rm {lock_path}); fluidctl makes a new one") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def record(host, why: str, detail: str, exclude_s: float = DEFAULT_EXCLUDE_S,
           job: str = "") -> Entry:
    """Put ``host`` (a Host, or a Slurm node's name) in the ledger, or renew its entry, for
    ``exclude_s`` seconds."""
    now = time.time()
    key = identity(host)
    entry = Entry(_name(host), why, detail, now, now + exclude_s, job,
                  node="" if key == _name(host) else key)
    with _locked() as path:
        book = _read(path)
        book.entries[entry.key] = entry
        _write(path, book)
    return entry


def entries(include_expired: bool = False) -> List[Entry]:
    with _locked() as path:
        found = _read(path).entries
    now = time.time()
    return sorted((e for e in found.values() if include_expired or e.active(now)),
                  key=lambda e: e.since)


def _matches(entry: Entry, host) -> bool:
    """An entry with an identity matches that node only; an old one (alias only) its alias."""
    return entry.node == identity(host) if entry.node else entry.host == _name(host)


def excluded(hosts: Iterable) -> Dict[str, Entry]:
    """The ledger's active entries among ``hosts`` (a plan's nodes: Hosts or Slurm names),
    by the name each host has here."""
    active = entries()
    out = {}
    for host in hosts:
        found = next((e for e in active if _matches(e, host)), None)
        if found is not None:
            out[_name(host)] = found
    return out


def clear(host: Optional[str] = None) -> List[str]:
    """Remove the entries of ``host`` (an alias, or an identity ADDRESS:PORT), or every entry;
    returns the names removed. A damaged file is a UsageError when ``host`` is named (nothing
    can be told about it), set aside when every entry is cleared."""
    from fluidctl.errors import UsageError
    with _locked() as path:
        book = _read(path)
        if book.damaged and host is not None:
            raise UsageError(f"the bad-node ledger {path} is damaged ({book.damaged}): "
                             f"{host} not cleared",
                             "fix the file, or clear every node with fluidctl cluster ledger "
                             "clear (the damaged file is kept beside it)")
        gone = [k for k, e in book.entries.items()
                if host is None or host in (e.host, e.node)]
        names = [book.entries.pop(k).host for k in gone]
        bad = [k for k in book.raw_bad if host is None or k == host]
        for k in bad:
            del book.raw_bad[k]
        if gone or bad or book.damaged or host is None:
            _write(path, book)
    return names + bad


def usable(names: Sequence, min_count: int, include_bad: bool = False,
           say: Optional[Callable[[str], None]] = None) -> List:
    """``names`` (a job's candidate nodes: Hosts or Slurm names) without the active entries,
    unless ``include_bad``; ``say`` hears one line naming those left out, why, and how to
    include them. A UsageError when fewer than ``min_count`` are left."""
    bad = {} if include_bad else excluded(names)
    if not bad:
        return list(names)
    from fluidctl.errors import UsageError
    left = [n for n in names if _name(n) not in bad]
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
