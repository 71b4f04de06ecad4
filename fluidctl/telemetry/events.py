"""The events a job's launcher emits, one class each: what happened, when (``time``, epoch
seconds), and the two lines people read: ``log_line()`` for launch.log (always) and
``console_line()`` for the console (None: launch.log and the events file only), on the
stream ``STREAM`` names. ``record()`` is the events file's JSON object (``{"event": KIND,
"time": ..., fields}``); ``from_record`` reads one back.
"""
from __future__ import annotations

import time as _time
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Dict, Optional, Tuple, Type


def _now():
    """Each event's last field, ``time``: when it happened (epoch seconds)."""
    return field(default_factory=_time.time)


class Event:
    """The base of every event (each one a frozen dataclass whose last field is ``time``)."""
    KIND: ClassVar[str] = ""
    STREAM: ClassVar[str] = "out"       # the console's stream: "out" or "err"
    time: float

    def log_line(self) -> str:
        raise NotImplementedError

    def console_line(self) -> Optional[str]:
        return f"fluidctl: {self.log_line()}"

    def record(self) -> dict:
        return {"event": self.KIND, **asdict(self)}


KINDS: Dict[str, Type[Event]] = {}


def _kind(cls):
    KINDS[cls.KIND] = cls
    return cls


def from_record(record: dict) -> Optional[Event]:
    """The event an events-file line holds (None: a kind or field this version does not know,
    e.g. written by a newer fluidctl)."""
    cls = KINDS.get(record.get("event", ""))
    if cls is None:
        return None
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v
                      for k, v in record.items() if k in names})
    except TypeError:
        return None


@_kind
@dataclass(frozen=True)
class Straggler(Event):
    """A confirmed straggler verdict (``diagnostics/stragglerwatch.py``); ``line`` is the
    sentence said, ``kind`` compute, data or link."""
    KIND: ClassVar[str] = "straggler"
    kind: str
    ranks: Tuple[int, ...]
    hosts: Dict[str, str]
    links: Tuple[Tuple[int, int], ...]
    slow_s: float
    normal_s: float
    collective_s: float
    collectives: int
    at_collective: int
    evidence: str
    line: str
    time: float = _now()

    def log_line(self) -> str:
        return self.line.removeprefix("fluidctl: ")

    def console_line(self) -> Optional[str]:
        return self.line

    def report(self) -> dict:
        """``LOG_DIR/stragglers.json``'s record."""
        record = asdict(self)
        record["ranks"], record["links"] = list(self.ranks), [list(p) for p in self.links]
        return record


@_kind
@dataclass(frozen=True)
class Hang(Event):
    """The hang watchdog's verdict: its class and sentence (None: the stacks could not tell),
    the ranks, where the stacks were written, the summary, and each rank's evidence."""
    KIND: ClassVar[str] = "hang"
    why: str
    dir: Optional[str] = None
    verdict: Optional[str] = None
    sentence: Optional[str] = None
    ranks: Tuple[int, ...] = ()
    summary: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    evidence: Tuple[dict, ...] = ()
    time: float = _now()

    def log_line(self) -> str:
        return f"hang: {self.sentence}" if self.sentence else f"hang: unclassified ({self.why})"

    def console_line(self) -> Optional[str]:
        return None             # the console prints the whole autopsy (launch/run.py)

    def failure_record(self) -> dict:
        """failure.json's ``hang``."""
        return {"why": self.why, "dir": self.dir, "class": self.verdict,
                "sentence": self.sentence, "ranks": list(self.ranks),
                "summary": list(self.summary), "notes": list(self.notes),
                "evidence": list(self.evidence)}


@_kind
@dataclass(frozen=True)
class Restart(Event):
    """The supervisor restarts the job after ``label`` on ``host`` failed."""
    KIND: ClassVar[str] = "restart"
    attempt: int
    of: int
    label: str
    host: str
    reason: str
    time: float = _now()

    def log_line(self) -> str:
        return (f"restart {self.attempt} of {self.of}: {self.label} on {self.host} failed "
                f"({self.reason})")

    def console_line(self) -> Optional[str]:
        return (f"fluidctl: {self.label} failed ({self.reason}); restarting the job "
                f"(restart {self.attempt} of {self.of})")


@_kind
@dataclass(frozen=True)
class World(Event):
    """An elastic job's new world, from restart ``attempt`` on."""
    KIND: ClassVar[str] = "world"
    STREAM: ClassVar[str] = "err"
    attempt: int
    trainers: int
    hosts: Tuple[str, ...]
    master: str
    time: float = _now()

    def log_line(self) -> str:
        return (f"restart {self.attempt}: new world of {self.trainers} trainer(s) on "
                f"{', '.join(self.hosts)}, MASTER_ADDR {self.master}")


@_kind
@dataclass(frozen=True)
class NodeLost(Event):
    """An elastic job's node lost (and recorded in the ledger of bad nodes)."""
    KIND: ClassVar[str] = "node_lost"
    STREAM: ClassVar[str] = "err"
    host: str
    why: str
    time: float = _now()

    def log_line(self) -> str:
        return f"node {self.host} lost: {self.why} (recorded in the ledger of bad nodes)"


@_kind
@dataclass(frozen=True)
class CheckpointCommit(Event):
    """Rank 0 committed a checkpoint (its record in ``LogLayout.checkpoint_state``);
    ``committed``: when, by the rank's clock; ``stop``: saved on a stop request."""
    KIND: ClassVar[str] = "checkpoint"
    step: int
    dir: str
    committed: float
    seconds: float = 0.0        # how long the save took, first write to commit
    stop: bool = False
    time: float = _now()

    def log_line(self) -> str:
        return (f"checkpoint committed: step {self.step} in {self.dir}"
                + (" (stopping on a request)" if self.stop else ""))

    def console_line(self) -> Optional[str]:
        return None             # the console says a stop's commit when the job ends
