"""The state a standalone pserver leaves behind: its JSON record (refreshed every second by the
server), pid file, generated token and daemon log; whether it still runs; and removing them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from fluidctl import paths
from fluidctl.errors import UsageError


def ensure_state_dir() -> None:
    where = paths.state_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use the state directory {where}: {exc.strerror or exc}",
                         "set FLUIDCTL_STATE_DIR to a writable directory") from None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only (a token), renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(path, text, 0o600)


def refuse_if_running(port: int) -> None:
    record = load_record(paths.pserver_state_file(port))
    if record and alive(record):
        raise UsageError(f"a pserver already runs on port {port} (pid {record['pid']})",
                         f"stop it first: fluidctl pserver stop --port {port}")


def load_record(path: Path) -> Optional[dict]:
    try:
        record = json.loads(paths.read_state_file(path))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def alive(record: dict) -> bool:
    """The record's server still runs (its pid not reused by another process)."""
    import psutil
    try:
        proc = psutil.Process(record["pid"])
        if proc.create_time() > record.get("started", float("inf")) + 1:
            return False                             # the pid was reused

        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and (
            "fluidctl" in " ".join(proc.cmdline()))
    except (psutil.Error, OSError):
        return False


def _pid_alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def records() -> List[dict]:
    """Every state record, by port, with ``state`` set to running, orphaned or dead."""
    out = []
    for path in sorted(paths.state_dir().glob("pserver-*.json")):
        record = load_record(path)
        if record is not None:
            record["state"] = "running" if alive(record) else "dead"
            launcher = record.get("launcher_pid")
            if record["state"] == "running" and isinstance(launcher, int) and not _pid_alive(
                    launcher):
                record["state"] = "orphaned"         # its launcher died; it is stopping
            record["record"] = str(path)
            out.append(record)
    return sorted(out, key=lambda r: r.get("port", 0))


def remove_record(record: dict, clean: bool) -> Optional[Path]:
    """Remove the record, the pid file and the generated token (a secret with no server
    behind it any more); the daemon's log too, but only after a ``clean`` stop whose log holds
    no warning, error or traceback: the log of a server that crashed, was killed or failed
    its last checkpoint is the evidence, so it stays. Returns the log when it is kept."""
    port = record.get("port")
    if not isinstance(port, int):
        return None
    log = paths.pserver_log_file(port)
    keep = log.exists() and (not clean or _log_has_trouble(log))
    doomed = [paths.pserver_state_file(port), paths.pserver_pid_file(port),
              paths.pserver_token_file(port)] + ([] if keep else [log])
    for path in doomed:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
    return log if keep else None


def _log_has_trouble(log: Path) -> bool:
    """A WARNING/ERROR/CRITICAL record, a traceback or an ``error:`` line in a daemon's log."""
    try:
        with open(log, errors="replace") as f:
            return any(" pserver WARNING " in line or " pserver ERROR " in line
                       or " pserver CRITICAL " in line or line.startswith(
                           ("Traceback", "error:")) for line in f)
    except OSError:
        return True                 # unreadable: not ours to throw away
