"""A job's ``Sink``: ``emit(event)`` hands each event to every handler, once, in order; a
handler that fails (a full disk, a closed console) never stops the job nor the others. The
sink keeps the last event of each kind and how many came (``last``, ``counts``): what the
failure report and a metrics exporter read without parsing anything.

``for_job`` makes the launcher's: the events file, launch.log, the console, the straggler
reports. ``using(sink)`` makes it the process's current sink for the job's life, so code far
from the supervisor (an elastic launcher regrouping its nodes) emits with ``emit(event)``.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from fluidctl.paths import LogLayout, write_atomic
from fluidctl.telemetry.events import Event, Straggler

Handler = Callable[[Event], None]


class Sink:
    def __init__(self, handlers: Sequence[Handler] = ()):
        self.handlers: List[Handler] = list(handlers)
        self.counts: Dict[str, int] = {}
        self._last: Dict[str, Event] = {}
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:            # one event at a time: lines and records never interleave
            self.counts[event.KIND] = self.counts.get(event.KIND, 0) + 1
            self._last[event.KIND] = event
            for handler in self.handlers:
                try:
                    handler(event)
                except Exception:   # noqa: BLE001 - a report must never end the job
                    pass

    def last(self, kind: str) -> Optional[Event]:
        return self._last.get(kind)


class EventsFile:
    """``LOG_DIR/events.jsonl``: one JSON object a line, appended (a reader of a running job
    sees whole lines; a line cut short by a crash is skipped by ``read_events``)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __call__(self, event: Event) -> None:
        line = json.dumps(event.record(), separators=(",", ":"), default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)


class LaunchLogLines:
    """Each event's ``log_line()`` into launch.log (``launch.supervisor.LaunchLog``)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log

    def __call__(self, event: Event) -> None:
        self.log(event.log_line())


class ConsoleLines:
    """Each event's ``console_line()``, if it has one, through ``say`` (the console echo,
    which never cuts into a rank's line) or, for ``STREAM == "err"``, to stderr."""

    def __init__(self, say: Callable[[str], None],
                 say_err: Optional[Callable[[str], None]] = None):
        self.say = say
        self.say_err = say_err or (lambda line: print(line, file=sys.stderr, flush=True))

    def __call__(self, event: Event) -> None:
        line = event.console_line()
        if line is not None:
            (self.say_err if event.STREAM == "err" else self.say)(line)


class StragglerFiles:
    """``LOG_DIR/stragglers.log`` (every verdict said, one line each; a submitted job's
    follower relays it) and ``stragglers.json`` (the latest, for tools)."""

    def __init__(self, layout: LogLayout):
        self.layout = layout

    def __call__(self, event: Event) -> None:
        if not isinstance(event, Straggler):
            return
        try:
            with open(self.layout.stragglers_log, "a", encoding="utf-8") as f:
                f.write(time.strftime("%Y-%m-%d %H:%M:%S ", time.localtime(event.time))
                        + event.line + "\n")
            write_atomic(self.layout.stragglers_json,
                         json.dumps(event.report(), indent=2) + "\n")
        except OSError:         # the log dir went away: the line was said
            pass


def for_job(log_root: Optional[Path], launch_log: Optional[Callable[[str], None]] = None,
            say: Optional[Callable[[str], None]] = None,
            say_err: Optional[Callable[[str], None]] = None) -> Sink:
    """The sink of a job whose reports go under ``log_root`` (None: a node agent's, which
    writes no LOG_DIR reports), with launch.log and the console where given."""
    handlers: List[Handler] = []
    if log_root is not None:
        layout = LogLayout(Path(log_root))
        handlers += [EventsFile(layout.events), StragglerFiles(layout)]
    if launch_log is not None:
        handlers.append(LaunchLogLines(launch_log))
    if say is not None or say_err is not None:
        handlers.append(ConsoleLines(say or (lambda line: print(line, flush=True)), say_err))
    return Sink(handlers)


def read_events(path: Path) -> List[dict]:
    """Every whole record of an events file, oldest first ([] before the first)."""
    return read_records(path, lambda record: "event" in record)


def read_records(path: Path, accept: Callable[[dict], bool]) -> List[dict]:
    """The JSON objects of a file of one a line that ``accept`` takes, in order ([] when
    there is no file); a line cut short (a running job's last) or not an object is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and accept(record):
            out.append(record)
    return out


_current: Optional[Sink] = None


def install(sink: Optional[Sink]) -> Optional[Sink]:
    """Make ``sink`` the process's current sink (the one job it runs); returns the one it
    replaces, to be installed again when the job ends."""
    global _current
    previous, _current = _current, sink
    return previous


@contextmanager
def using(sink: Sink) -> Iterator[Sink]:
    """``sink`` is the process's current sink inside the block."""
    previous = install(sink)
    try:
        yield sink
    finally:
        install(previous)


def emit(event: Event, otherwise: Optional[Callable[[str], None]] = None) -> None:
    """To the current sink; without one, ``otherwise(event.log_line())`` where given."""
    sink = _current
    if sink is not None:
        sink.emit(event)
    elif otherwise is not None:
        otherwise(event.log_line())
