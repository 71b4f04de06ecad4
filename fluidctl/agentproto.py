"""The node agent's line protocol, both ends: the launcher (``backends/ssh/agent.py``) and the
agent on each node (``node/agent.py``). One line each way; an agent line is MARK, a tag, "|", text.

Its own module, standard library only, so the agent can answer its first line (the probe)
before it imports the supervisor, the planner and the diagnostics it needs later: the launcher
plans while they load. The records both ends exchange (``Probe``, ``NodeShare``, ``Ends`` of
``ProcessEnd``) are typed here, each with ``to_wire``/``from_wire``; a record that is not what
this version sends raises ``RecordError``.
"""
from enum import Enum

from fluidctl.sigs import GRACE_PERIOD

MARK = "@@fluidctl "          # every agent line starts with it; the rest is "<tag>|<text>"
PROBE_TAG = "probe"
FAILURE_TAG = "failure"
SAY_TAG = "say"
BEAT_TAG = "beat"           # "beat|<collectives completed by this node's ranks>"
DOCTOR_TAG = "doctor"       # the answer to a {"doctor": ...} line: this node's problems
STACKS_TAG = "stacks"       # the answer to a "dump" line on stdin: this node's ranks' stacks
STEPS_TAG = "steps"         # this node's ranks' straggler sums (diagnostics/stragglers.py)
USAGE_TAG = "usage"         # this node's ranks' CPU%, RSS and GPU use (observe/usage.py)
ENDS_TAG = "ends"           # the last record: every process's final state on this node
DUMP_COMMAND = "dump"       # a line the launcher writes to the agent's stdin
BEAT_COMMAND = "beat"       # the launcher's heartbeat on the agent's stdin (elastic jobs)
STOP_COMMAND = "stop"       # stop the node's processes, as SIGTERM to the agent does
# "checkpoint SIGNAL": a checkpoint request (stop after it): the agent creates its node's request
# file (FLUIDCTL_CHECKPOINT_REQUEST of its ranks), then sends SIGNAL to its ranks;
# "checkpoint save": checkpoint and go on (fluidctl job checkpoint): the file alone, no signal
CHECKPOINT_COMMAND = "checkpoint"
# Elastic jobs (--nodes MIN:MAX): both ends beat every FLUIDCTL_HEARTBEAT_TIMEOUT / BEAT_MISSES
# seconds (0.5 by default), each from its own thread (a node at 100% CPU still beats);
# BEAT_MISSES beats missed in a row and the other end is gone: the launcher declares the node
# lost, the agent stops its ranks. The bound, stated: a node is declared lost within
# FLUIDCTL_HEARTBEAT_TIMEOUT (3 s) of its last beat, plus the launcher's check period
# (WATCH_EVERY).
BEAT_MISSES = 6
WATCH_EVERY = 0.1
CR_MARK = "\x1f"            # a streamed line that ended with a lone \r (a progress bar)
AGENT_MODULE = "fluidctl.node.agent"
DOCTOR_CONNECT_TIMEOUT = 5.0  # seconds a node gives the master port in the rendezvous check
# how a node's rendezvous check line for a master port it cannot reach begins
DOCTOR_UNREACHED = "cannot reach the master"


def tag_for(role: str, rank: int) -> str:
    return f"{role} {rank}"


def parse_line(line: str):
    """(tag, text) for an agent line, else None (an ordinary line, e.g. a Python traceback)."""
    if not line.startswith(MARK):
        return None
    tag, sep, text = line[len(MARK):].partition("|")
    return (tag, text) if sep else None


# --- the records both ends exchange ----------------------------------------------------------
# Plain classes, not dataclasses: the agent imports this module before it answers its probe,
# and importing dataclasses costs more than these few lines.

class RecordError(ValueError):
    """A record from the other end that is not what this version sends (a missing key, a
    wrong type): one sentence naming the record and the key."""


_REQUIRED = object()


def _take(record, what: str, key: str, types: tuple, default=_REQUIRED):
    """``record[key]`` checked against ``types`` (a bool is no int here)."""
    if key not in record:
        if default is _REQUIRED:
            raise RecordError(f"the {what} record has no {key!r}")
        return default
    value = record[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise RecordError(f"the {what} record's {key!r} is {type(value).__name__}, "
                          f"not {wanted}")
    return value


def _object(record, what: str) -> dict:
    if not isinstance(record, dict):
        raise RecordError(f"the {what} record is {type(record).__name__}, not an object")
    return record


class _Record:
    """Equality, repr and JSON text for a record class with ``__slots__``, ``to_record()``
    and ``from_record()``."""
    __slots__ = ()
    what = "?"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"

    def to_wire(self) -> str:
        import json
        return json.dumps(self.to_record())

    @classmethod
    def from_wire(cls, text: str):
        import json
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise RecordError(f"the {cls.what} record is not JSON ({exc})") from None
        return cls.from_record(record)


_INT, _STR, _NUM = (int,), (str,), (int, float)
_OPT_INT = (int, type(None))


class Probe(_Record):
    """What an agent reports on its node before the launcher plans: versions, where it runs,
    free disk, GPUs (ids as its CUDA_VISIBLE_DEVICES names them), free ports, interfaces."""
    __slots__ = ("python", "fluidctl", "executable", "disk_free", "cwd", "gpu_ids", "ports",
                 "ifaces")
    what = PROBE_TAG

    def __init__(self, python: str, fluidctl: str, executable: str, disk_free: int, cwd: str,
                 gpu_ids: list, ports: list, ifaces: dict):
        self.python, self.fluidctl, self.executable = python, fluidctl, executable
        self.disk_free, self.cwd, self.gpu_ids, self.ports = disk_free, cwd, gpu_ids, ports
        self.ifaces = ifaces            # {name: [[address, netmask], ...]}

    @property
    def gpus(self) -> int:
        return len(self.gpu_ids)

    def to_record(self) -> dict:
        return {"python": self.python, "fluidctl": self.fluidctl,
                "executable": self.executable, "disk_free": self.disk_free, "cwd": self.cwd,
                "gpus": self.gpus, "gpu_ids": list(self.gpu_ids), "ports": list(self.ports),
                "ifaces": {name: [list(a) for a in addrs]
                           for name, addrs in self.ifaces.items()}}

    @classmethod
    def from_record(cls, record) -> "Probe":
        r, w = _object(record, cls.what), cls.what
        fluidctl = _take(r, w, "fluidctl", _STR)    # first: a version mismatch says so
        return cls(_take(r, w, "python", _STR), fluidctl, _take(r, w, "executable", _STR),
                   _take(r, w, "disk_free", _INT), _take(r, w, "cwd", _STR),
                   [str(g) for g in _take(r, w, "gpu_ids", (list,))],
                   _ints(_take(r, w, "ports", (list,)), w, "ports"),
                   _ifaces(_take(r, w, "ifaces", (dict,)), w))


def _ints(values: list, what: str, key: str) -> list:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise RecordError(f"the {what} record's {key!r} holds something other than integers")
    return values


def _ifaces(ifaces: dict, what: str) -> dict:
    for addrs in ifaces.values():
        if not isinstance(addrs, list) or not all(
                isinstance(a, list) and len(a) == 2 and all(isinstance(x, str) for x in a)
                for a in addrs):
            raise RecordError(f"the {what} record's 'ifaces' are not [[address, netmask]] lists")
    return ifaces


class NodeShare(_Record):
    """A node's share of the plan, sent by the launcher as one line on the agent's stdin.
    ``procs``: the node's ProcSpec records (``ProcSpec.to_json()``); ``marker``: the nonce of
    the launcher's shared marker, which tells the agent whether its LOG_DIR is the
    launcher's; ``beat``: seconds between the launcher's heartbeats on stdin (0: none, the
    agent then only stops when stdin closes); ``checkpoint_signal``: what the ranks trap as a
    checkpoint request (--checkpoint-signal)."""
    __slots__ = ("procs", "attempt", "max_restarts", "grace", "log_dir", "host", "marker",
                 "beat", "checkpoint_signal")
    what = "node plan"

    def __init__(self, procs: list, log_dir: str, host: str, *, attempt: int = 0,
                 max_restarts: int = 0, grace: float = GRACE_PERIOD, marker: str = "",
                 beat: float = 0.0, checkpoint_signal: str = "TERM"):
        self.procs, self.log_dir, self.host = procs, log_dir, host
        self.attempt, self.max_restarts, self.grace = attempt, max_restarts, grace
        self.marker, self.beat, self.checkpoint_signal = marker, beat, checkpoint_signal

    SHARED_MIN = 1024       # bytes from which a value every process's env repeats goes once

    def to_record(self) -> dict:
        procs, shared = _share_env(self.procs, self.SHARED_MIN)
        return {"procs": procs, "shared_env": shared, "attempt": self.attempt,
                "max_restarts": self.max_restarts, "grace": self.grace,
                "log_dir": self.log_dir, "host": self.host, "marker": self.marker,
                "beat": self.beat, "checkpoint_signal": self.checkpoint_signal}

    @classmethod
    def from_record(cls, record) -> "NodeShare":
        r, w = _object(record, cls.what), cls.what
        procs = _take(r, w, "procs", (list,))
        if not all(isinstance(p, dict) for p in procs):
            raise RecordError(f"the {w} record's 'procs' holds something other than objects")
        shared = _take(r, w, "shared_env", (dict,), {})
        if shared:
            if not all(isinstance(p.get("env"), dict) for p in procs):
                raise RecordError(f"the {w} record's 'procs' have no 'env' to share into")
            procs = [dict(p, env={**p["env"], **shared}) for p in procs]
        attempt = _take(r, w, "attempt", _INT, 0)
        return cls(procs, _take(r, w, "log_dir", _STR), _take(r, w, "host", _STR),
                   attempt=attempt, max_restarts=_take(r, w, "max_restarts", _INT, attempt),
                   grace=float(_take(r, w, "grace", _NUM, GRACE_PERIOD)),
                   marker=_take(r, w, "marker", _STR, ""),
                   beat=float(_take(r, w, "beat", _NUM, 0.0)),
                   checkpoint_signal=_take(r, w, "checkpoint_signal", _STR, "TERM"))


def _share_env(procs: list, least: int):
    """(procs without the env values of ``least`` bytes or more that every one repeats, those
    values): a job-wide list (PADDLE_TRAINER_ENDPOINTS) crosses to a node once, not once per
    process, so a node's share grows with its own processes only."""
    envs = [p.get("env") for p in procs]
    if len(procs) < 2 or not all(isinstance(e, dict) for e in envs):
        return list(procs), {}
    shared = {k: v for k, v in envs[0].items() if isinstance(v, str) and len(v) >= least
              and all(e.get(k) is v or e.get(k) == v for e in envs[1:])}
    if not shared:
        return list(procs), {}
    return [dict(p, env={k: v for k, v in p["env"].items() if k not in shared})
            for p in procs], shared


class EndState(Enum):
    """How a process of the job ended."""
    FINISHED = "finished"       # exit 0
    FAILED = "failed"           # ended on its own with a non-zero code or a signal
    STOPPED = "stopped"         # still running when fluidctl stopped the job


class ProcessEnd(_Record):
    """One process's final state; ``returncode`` (Popen-style) where one was seen. Words for
    people: ``fluidctl.diagnostics.failures.describe_end``."""
    __slots__ = ("label", "host", "pid", "state", "returncode")
    what = "process end"

    def __init__(self, label: str, host: str, pid, state: EndState, returncode=None):
        self.label, self.host, self.pid = label, host, pid
        self.state, self.returncode = state, returncode

    def to_record(self) -> dict:
        return {"label": self.label, "host": self.host, "pid": self.pid,
                "state": self.state.value, "returncode": self.returncode}

    @classmethod
    def from_record(cls, record) -> "ProcessEnd":
        r, w = _object(record, cls.what), cls.what
        state = _take(r, w, "state", _STR)
        try:
            end_state = EndState(state)
        except ValueError:
            raise RecordError(f"the {w} record's state {state!r} is none of "
                              + ", ".join(s.value for s in EndState)) from None
        return cls(_take(r, w, "label", _STR), _take(r, w, "host", _STR),
                   _take(r, w, "pid", _OPT_INT, None), end_state,
                   _take(r, w, "returncode", _OPT_INT, None))


class Ends(_Record):
    """The agent's last record: every process's final state on its node."""
    __slots__ = ("ends",)
    what = ENDS_TAG

    def __init__(self, ends: list):
        self.ends = list(ends)

    def to_record(self) -> list:
        return [e.to_record() for e in self.ends]

    @classmethod
    def from_record(cls, record) -> "Ends":
        if not isinstance(record, list):
            raise RecordError(f"the {cls.what} record is {type(record).__name__}, not a list")
        return cls([ProcessEnd.from_record(e) for e in record])
