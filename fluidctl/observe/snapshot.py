"""One view of a job, from what fluidctl already writes in its log dir: ``live.json`` (the
launcher's per-rank step times and states, ``observe.live``), ``events.jsonl`` (stragglers,
hangs, restarts, worlds, lost nodes, checkpoints), ``job.json``, ``failure.json`` and the last
line of each rank's log. ``Reader.read()`` returns it as a plain dict (``fluidctl top --json``
prints it as it is); a ``Reader`` kept across frames reads the events file from where it
stopped and keeps each rank's process for CPU% (psutil) on this host.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from fluidctl.paths import LogLayout, read_state_file

STALE = 60.0            # seconds a straggler verdict stays on its ranks' rows
TAIL = 4096             # bytes read from the end of a rank's log for its last line
# a script declares its total in its own output: "step 120/1000", "[120/1000]"
_PROGRESS = re.compile(r"(\d+)\s*/\s*(\d+)")
_RANK_LOG = re.compile(r"workerlog\.(\d+)$")
EVENT_KINDS = ("straggler", "hang", "restart", "world", "node_lost", "checkpoint")


def last_line(path: Path) -> str:
    """The last non-empty line of a log (the last state of a line redrawn with \\r)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL))
            data = f.read(TAIL)
    except OSError:
        return ""
    for line in reversed(data.decode("utf-8", "replace").splitlines()):
        line = line.rsplit("\r", 1)[-1].strip()
        if line:
            return line
    return ""


def declared_progress(line: str) -> Optional[Tuple[int, int]]:
    """(done, total) from a log line that says it ("step 120/1000"), else None (fluidctl's
    own lines in the log, such as a restart's header, say nothing of the script's)."""
    if "fluidctl" in line:
        return None
    found = [(int(a), int(b)) for a, b in _PROGRESS.findall(line)]
    found = [(a, b) for a, b in found if 0 < b and a <= b]
    return found[-1] if found else None


def _json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(read_state_file(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Events:
    """``events.jsonl`` read incrementally: counts per kind, the latest straggler per rank,
    checkpoint durations, lost hosts, the newest hang and the attempt number."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.counts: Dict[str, int] = {k: 0 for k in EVENT_KINDS}
        self.stragglers: Dict[int, dict] = {}       # rank -> its newest straggler event
        self.lost: Dict[str, dict] = {}             # host -> its node_lost event
        self.checkpoint_seconds: List[float] = []
        self.last_checkpoint: Optional[dict] = None
        self.hang: Optional[dict] = None
        self.attempt = 0

    def update(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        whole = data[:data.rfind(b"\n") + 1]        # a line still being written waits
        self.offset += len(whole)
        for line in whole.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.add(record)

    def add(self, record: dict) -> None:
        kind = record.get("event")
        if kind not in self.counts:
            return
        self.counts[kind] += 1
        if kind == "straggler":
            for rank in record.get("ranks") or ():
                self.stragglers[int(rank)] = record
        elif kind == "node_lost":
            self.lost[str(record.get("host"))] = record
        elif kind == "checkpoint":
            self.checkpoint_seconds.append(float(record.get("seconds") or 0.0))
            self.last_checkpoint = record
        elif kind == "hang":
            self.hang = record
        if kind in ("restart", "world"):
            self.attempt = max(self.attempt, int(record.get("attempt") or 0))


def verdict_of(rank: int, host: Optional[str], events: Events, now: float) -> str:
    """The words on a rank's row: lost node, hang, or a straggler verdict still fresh."""
    if host is not None and host in events.lost:
        return "node lost"
    if events.hang and rank in (events.hang.get("ranks") or ()):
        return f"hang: {events.hang.get('verdict') or 'unclassified'}"
    found = events.stragglers.get(rank)
    if found and now - float(found.get("time") or 0) <= STALE:
        return f"slow {found.get('kind')}"
    return ""


class Procs:
    """CPU% and RSS of rank processes on this host (psutil), and their GPU use where NVML is
    there (nvidia-ml-py, optional). A process is kept across frames: CPU% is since the last
    frame."""

    def __init__(self):
        self.procs: Dict[int, object] = {}
        self.nvml = _nvml()

    def prime(self, pids) -> None:
        for pid in pids:
            self._proc(pid)

    def _proc(self, pid: int):
        import psutil
        proc = self.procs.get(pid)
        if proc is None:
            try:
                proc = self.procs[pid] = psutil.Process(pid)
                proc.cpu_percent(None)
            except psutil.Error:
                return None
        return proc

    def usage(self, pid: int) -> dict:
        import psutil
        proc = self._proc(pid)
        if proc is None:
            return {}
        try:
            with proc.oneshot():
                out = {"cpu": proc.cpu_percent(None), "rss": proc.memory_info().rss}
        except psutil.Error:
            self.procs.pop(pid, None)
            return {}
        if self.nvml:
            out.update(self.nvml.get(pid, {}))
        return out

    def refresh_gpus(self) -> None:
        if self.nvml is not None:
            self.nvml = _nvml() or {}


def _nvml() -> Optional[dict]:
    """pid -> {gpu, gpu_util, gpu_mem} from NVML; None without nvidia-ml-py or a driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:       # noqa: BLE001 - not installed, no driver, no GPU
        return None
    found: Dict[int, dict] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            dev = pynvml.nvmlDeviceGetHandleByIndex(index)
            util = pynvml.nvmlDeviceGetUtilizationRates(dev).gpu
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(dev):
                found[p.pid] = {"gpu": index, "gpu_util": util,
                                "gpu_mem": p.usedGpuMemory or 0}
    except Exception:       # noqa: BLE001
        pass
    return found


def blank(job: str, backend: str, rows: List[dict], running: bool, **extra) -> dict:
    """A snapshot of what a backend can see without the launcher's readings (Kubernetes:
    pods through the API): the same keys, no step times nor events."""
    return {"log_dir": None, "running": running, "starting": False, "job": job,
            "backend": backend, "launcher_pid": None, "launcher_host": None, "metrics": None,
            "world": len(rows), "attempt": 1, "uptime": None, "steps_per_s": None,
            "progress": None, "eta": None, "events": {k: 0 for k in EVENT_KINDS},
            "checkpoint": {"last": None, "seconds": []}, "hang": None, "hang_timeout": None,
            "failure": None, "buckets": None, "time": time.time(), "ranks": rows,
            "histograms": {}, **extra}


def _alive(job: dict) -> bool:
    """The launcher a record names (job.json, live.json: its pid and host) runs; on another
    host it is taken as running."""
    if job.get("host") != os.uname().nodename:
        return True
    try:
        pid = int(job.get("pid", 0))
        os.kill(pid, 0)
    except PermissionError:             # another user's: it runs
        return True
    except (OSError, ValueError, TypeError):
        return False
    return pid > 0


class Reader:
    """Reads a job's snapshot from its log dir (``live``: the launcher's record in memory
    instead of live.json, for its metrics endpoint)."""

    def __init__(self, log_root: Path, live: Optional[Callable[[], dict]] = None,
                 procs: bool = True):
        self.layout = LogLayout(Path(log_root))
        self.live = live
        self.events = Events(self.layout.events)
        self.procs = Procs() if procs else None
        self.here = os.uname().nodename
        self._progress: Optional[Tuple[float, int]] = None

    def _live(self) -> Optional[dict]:
        return self.live() if self.live is not None else _json(self.layout.live)

    def _rank_log(self, rank: int, host: Optional[str]) -> Path:
        if host:
            remote = self.layout.for_host(host).worker(rank)
            if remote.exists():
                return remote
        return self.layout.worker(rank)

    def _ended_ranks(self) -> Dict[str, dict]:
        """A job not running: its ranks from its logs and failure.json."""
        ranks: Dict[str, dict] = {}
        for where in [self.layout.root] + [d for d in self.layout.root.glob("*")
                                           if d.is_dir()]:
            for path in where.glob("workerlog.*"):
                found = _RANK_LOG.search(path.name)
                if found:
                    host = None if where == self.layout.root else where.name
                    ranks.setdefault(found.group(1), {"host": host, "pid": None,
                                                      "state": "ended"})
        failure = _json(self.layout.failure_json) or {}
        for proc in failure.get("processes") or ():
            label = str(proc.get("label", ""))
            if label.startswith("trainer ") and label[8:] in ranks:
                ranks[label[8:]]["state"] = str(proc.get("state", "ended")).lower()
        return ranks

    def read(self) -> dict:
        self.events.update()
        live = self._live()
        now = time.time()
        # the launcher's last record stays when the job ends ("ended"); one whose launcher
        # is gone without writing it (SIGKILL) is an ended job too
        running = live is not None and not live.get("ended") and _alive(live)
        job = _json(self.layout.job_state) or {}
        raw = live["ranks"] if live is not None else self._ended_ranks()
        here = running and live.get("host") == self.here
        rows = []
        for key, info in sorted(raw.items(), key=lambda kv: int(kv[0])):
            rank, host = int(key), info.get("host")
            row = {"rank": rank, "host": host, "pid": info.get("pid"),
                   "state": info.get("state", "unknown"), "step": info.get("count"),
                   "p50": info.get("p50"), "p99": info.get("p99"), "rate": info.get("rate"),
                   "shares": info.get("shares"), "source": info.get("source"),
                   "cpu": None, "rss": None,
                   "last_line": last_line(self._rank_log(rank, host)),
                   "verdict": verdict_of(rank, host, self.events, now)}
            if info.get("why"):
                row["verdict"] = row["verdict"] or "node lost"
            row.update(info.get("usage") or {})         # a node agent's report
            if self.procs is not None and here and row["pid"] and row["state"] == "running" \
                    and host in (self.here, "127.0.0.1", "localhost", "::1"):
                row.update(self.procs.usage(row["pid"]))
            rows.append(row)
        started = (live or {}).get("started") or job.get("started")
        ended_at = (live or {}).get("time") if not running else None
        uptime = ((ended_at or now) - started) if started and live is not None else None
        rates = [r["rate"] for r in rows if r["rate"] is not None and r["state"] == "running"]
        pace = min(rates) if rates else None
        progress = declared_progress(rows[0]["last_line"]) if rows else None
        return {
            "log_dir": str(self.layout.root), "running": running,
            # a launcher that is starting its ranks (job.json, no live.json yet)
            "starting": not running and bool(job) and _alive(job),
            "job": (live or {}).get("job") or job.get("job") or self.layout.root.name,
            "backend": (live or {}).get("backend"), "launcher_pid": (live or {}).get("pid"),
            "launcher_host": (live or {}).get("host"), "metrics": (live or {}).get("metrics"),
            "world": len(rows), "attempt": self.events.attempt + 1, "uptime": uptime,
            "steps_per_s": pace, "progress": progress,
            "eta": self._eta(progress, uptime, now),
            "events": dict(self.events.counts),
            "checkpoint": {"last": self.events.last_checkpoint,
                           "seconds": list(self.events.checkpoint_seconds)},
            "hang": self.events.hang, "hang_timeout": (live or {}).get("hang_timeout"),
            "failure": None if running else _json(self.layout.failure_json),
            "buckets": (live or {}).get("buckets"), "time": now, "ranks": rows,
            "histograms": {str(r): (raw[str(r)].get("buckets"), raw[str(r)].get("sum"),
                                    raw[str(r)].get("observed"))
                           for r in (row["rank"] for row in rows)
                           if raw[str(r)].get("buckets") is not None},
        }

    def _eta(self, progress, uptime, now) -> Optional[float]:
        """Seconds left, from the declared progress and its rate since the last frame (or
        since the start)."""
        if not progress or not uptime:
            return None
        done, total = progress
        before, self._progress = self._progress, (now, done)
        if before is not None and done > before[1] and now > before[0]:
            return (total - done) * (now - before[0]) / (done - before[1])
        return (total - done) * uptime / done if done else None
