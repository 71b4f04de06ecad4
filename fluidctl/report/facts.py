"""What a job's log dir says, read into plain records for the report: the timeline, each
rank's step time, the failure or hang, the plan. Every reader takes what is there and skips
what is not (a running job has no failure.json yet; an older one no events.jsonl), so a report
of a running job shows the job so far.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fluidctl.paths import LogLayout, read_state_file

# launch.log lines the events file does not hold: attempts, preemptions, the job's end
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")
_ATTEMPT = re.compile(r"^attempt (\d+): (.*)$")
_PREEMPT = re.compile(r"^(received SIG\w+: stopping the job|stopping the job: .*|"
                      r"checkpoint requested \(.*)$")
_EXIT = re.compile(r"^exit code (-?\d+)$")
_HEADER = re.compile(r"^fluidctl job over (\S+): (\d+) trainer\(s\) on (\d+) node\(s\), "
                     r"mode (\S+), master (.*?), argv (.*)$")


@dataclass
class Mark:
    """One thing on the timeline: ``kind`` (attempt, end, restart, world, node_lost,
    checkpoint, preempt, straggler, hang, exit), when (epoch seconds) and its sentence."""
    kind: str
    time: float
    text: str
    attempt: Optional[int] = None
    ranks: Tuple[int, ...] = ()


@dataclass
class Plan:
    backend: str = ""
    trainers: int = 0
    nodes: int = 0
    mode: str = ""
    master: str = ""
    argv: str = ""
    procs: List[Tuple[str, int, str, str]] = field(default_factory=list)  # role rank host ep


@dataclass
class Facts:
    root: Path
    marks: List[Mark]
    history: List[dict]
    plan: Plan
    failure: Optional[dict]
    hangs: List[Tuple[str, str]]        # (directory name, summary.txt)
    running: bool
    exit_code: Optional[int]

    @property
    def ranks(self) -> List[int]:
        """Every rank the job ran or runs: the plan's trainers and those with a history."""
        found = {r for role, r, _, _ in self.plan.procs if role.upper() == "TRAINER"}
        for record in self.history:
            found.update(int(r) for r in record["ranks"])
        return sorted(found)

    @property
    def hosts(self) -> Dict[int, str]:
        return {r: h for role, r, h, _ in self.plan.procs if role.upper() == "TRAINER"}

    @property
    def start(self) -> Optional[float]:
        times = [m.time for m in self.marks] + [r["t"] - r.get("dt", 0) for r in self.history]
        return min(times) if times else None


def _local_epoch(stamp: str) -> float:
    """launch.log's stamps are the launcher's local time, to the second."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def launch_lines(text: str) -> List[Tuple[float, str]]:
    """launch.log's stamped lines: (epoch second, what was said)."""
    out = []
    for line in text.splitlines():
        found = _STAMP.match(line)
        if found:
            try:
                out.append((_local_epoch(found[1]), found[2]))
            except ValueError:
                continue
    return out


def launch_marks(lines: List[Tuple[float, str]]) -> Tuple[List[Mark], Plan, Optional[int]]:
    """(the timeline marks only launch.log has, the plan's summary, the exit code said)."""
    marks, plan, exit_code = [], Plan(), None
    for when, said in lines:
        header, attempt = _HEADER.match(said), _ATTEMPT.match(said)
        if header and not plan.backend:
            plan = Plan(header[1], int(header[2]), int(header[3]), header[4], header[5],
                        header[6])
        elif attempt:
            kind = "attempt" if attempt[2].startswith("started") else "end"
            marks.append(Mark(kind, when, said, int(attempt[1])))
        elif _PREEMPT.match(said):
            marks.append(Mark("preempt", when, said))
        elif _EXIT.match(said):
            exit_code = int(_EXIT.match(said)[1])
            marks.append(Mark("exit", when, said))
    return marks, plan, exit_code


def in_order(lines: List[Tuple[float, str]], launch: List[Mark], events: List[Mark]
             ) -> List[Mark]:
    """Every mark in the order things happened. launch.log says each event too, in order,
    to the second; the events file to the microsecond: marks go in launch.log's order, an
    event's line takes the event's own time, and a line only launch.log has the latest time
    before it (at least its own second), so the two files never disagree on the order.
    Events launch.log does not hold are put in by time."""
    waiting: Dict[str, List[Mark]] = {}
    for event in events:
        waiting.setdefault(event.text, []).append(event)
    by_line = {(m.time, m.text): m for m in launch}
    out, last = [], float("-inf")
    for when, said in lines:
        if waiting.get(said):
            mark = waiting[said].pop(0)
        elif (when, said) in by_line:
            mark = by_line.pop((when, said))
            mark.time = max(when, min(last, when + 0.999))
        else:
            continue
        last = max(last, mark.time)
        out.append(mark)
    rest = [m for left in waiting.values() for m in left]
    return sorted(out + rest, key=lambda m: m.time) if rest else out


def event_marks(records: List[dict]) -> List[Mark]:
    """The events file's records as marks (each with its launch.log sentence)."""
    from fluidctl.telemetry import from_record
    out = []
    for record in records:
        event = from_record(record)
        if event is None:
            continue
        out.append(Mark(event.KIND, float(event.time), event.log_line(),
                        getattr(event, "attempt", None),
                        tuple(getattr(event, "ranks", ()) or ())))
    return out


def read_endpoints(text: str) -> List[Tuple[str, int, str, str]]:
    """endpoints.log's processes: (role, rank, host, endpoint)."""
    procs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1].isdigit():
            procs.append((parts[0], int(parts[1]), parts[2], parts[3]))
    return procs


def _text(path: Path, limit: int = 64 << 20) -> str:
    try:
        return read_state_file(path, limit).decode("utf-8", "replace")
    except OSError:
        return ""


def read_failure(layout: LogLayout) -> Optional[dict]:
    """failure.json, if the job wrote one and it is an object."""
    try:
        record = json.loads(_text(layout.failure_json) or "null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_hangs(layout: LogLayout) -> List[Tuple[str, str]]:
    """Every hang-*/ and dump-*/ directory's summary, oldest first."""
    found = []
    for where in sorted(list(layout.root.glob("hang-*")) + list(layout.root.glob("dump-*"))):
        summary = _text(where / "summary.txt", 1 << 20)
        if summary:
            found.append((where.name, summary))
    return found


def read(layout: LogLayout) -> Facts:
    """Everything the report shows of the job in ``layout``."""
    from fluidctl.telemetry import read_events
    from fluidctl.telemetry.steptimes import read_history
    lines = launch_lines(_text(layout.launch))
    launch, plan, exit_code = launch_marks(lines)
    marks = in_order(lines, launch, event_marks(read_events(layout.events)))
    plan.procs = read_endpoints(_text(layout.endpoints))
    failure = read_failure(layout)
    if exit_code is None and failure is not None and isinstance(failure.get("exit_code"), int):
        exit_code = failure["exit_code"]
    running = layout.job_state.exists() and exit_code is None
    return Facts(layout.root, marks, read_history(layout.step_history), plan, failure,
                 read_hangs(layout), running, exit_code)
