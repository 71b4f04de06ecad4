"""``fluidctl pserver start|status|stop``: standalone parameter servers.

``start`` runs ``python -m fluidctl.runtime.pserver`` in the foreground, or detached with
``--daemon`` (new session, log in the state directory, returns once the server listens).
Every pserver leaves a pid file and a JSON state record (``fluidctl.paths``), refreshed every
second; ``status`` reads them, ``stop`` sends SIGTERM (the server checkpoints and exits 0).
"""
from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import click

from fluidctl.commands.numbers import seconds
from fluidctl import envs, paths
from fluidctl.console import console
from fluidctl.units import human_bytes
from fluidctl.errors import FluidctlError, UsageError

START_TIMEOUT = 30.0


@click.group(name="pserver", help="""Standalone parameter servers for pserver-mode jobs.

\b
Examples:
  fluidctl pserver start --port 7164 --num-gradient-servers 2 --daemon --token-file job.token
  fluidctl pserver status
  fluidctl pserver stop --port 7164
""")
def pserver():
    pass


# --- start --------------------------------------------------------------------------------

@pserver.command("start")
@click.option("--host", default="0.0.0.0", show_default=True,
              help="Address to listen on, e.g. --host 10.0.0.5.")
@click.option("--port", type=click.IntRange(0, 65535), default=7164, show_default=True,
              help="First port, e.g. --port 7164 (0 picks a free one; not with --daemon).")
@click.option("--ports-num", "--ports_num", "ports_num", type=click.IntRange(1, 64), default=1,
              show_default=True, help="Ports to listen on from --port up, e.g. --ports-num 2.")
@click.option("--ports-num-for-sparse", "--ports_num_for_sparse", "ports_num_for_sparse",
              type=click.IntRange(0, 64), default=0, show_default=True,
              help="Extra ports after those, e.g. --ports-num-for-sparse 1 (same protocol).")
@click.option("--num-gradient-servers", "--num_gradient_servers", "--trainers", "trainers",
              type=click.IntRange(1), default=None,
              help="Number of trainers, e.g. --trainers 4 (default: PADDLE_TRAINERS_NUM or 1).")
@click.option("--sync/--async", "sync", default=None,
              help="Synchronous SGD (a barrier per step; default) or asynchronous updates.")
@click.option("--pserver-id", type=click.IntRange(0), default=None,
              help="This server's index; pservers sharing --checkpoint-dir need distinct ids, "
                   "e.g. --pserver-id 1.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Save the shard here on SIGTERM (and every --checkpoint-every steps); "
                   "reload it on start, e.g. --checkpoint-dir ckpt/.")
@click.option("--checkpoint-every", type=click.IntRange(0), default=0, show_default=True,
              help="Steps between checkpoints, e.g. --checkpoint-every 100 (0: only on stop).")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the job token trainers must present, e.g. --token-file "
                   "job.token (default: FLUIDCTL_JOB_TOKEN; --daemon generates one).")
@click.option("--max-frame-mb", type=click.IntRange(1), default=1024, show_default=True,
              help="Largest request accepted, in MiB, e.g. --max-frame-mb 256.")
@click.option("--daemon", is_flag=True,
              help="Detach; log to the state directory, e.g. fluidctl pserver start --daemon.")
def start(host, port, ports_num, ports_num_for_sparse, trainers, sync, pserver_id,
          checkpoint_dir, checkpoint_every, token_file, max_frame_mb, daemon):
    """Start a parameter server.

    \b
    Examples:
      fluidctl pserver start --port 7164 --trainers 2
      fluidctl pserver start --port 7164 --ports_num 1 --num_gradient_servers 4 --async
      fluidctl pserver start --port 7164 --checkpoint-dir ckpt --checkpoint-every 50 --daemon
    """
    argv = ["--host", host, "--port", str(port), "--ports-num", str(ports_num),
            "--ports-num-for-sparse", str(ports_num_for_sparse),
            "--max-frame-mb", str(max_frame_mb), "--checkpoint-every", str(checkpoint_every)]
    if trainers is not None:
        argv += ["--trainers", str(trainers)]
    if sync is not None:
        argv.append("--sync" if sync else "--async")
    if pserver_id is not None:
        argv += ["--pserver-id", str(pserver_id)]
    if checkpoint_dir:
        argv += ["--checkpoint-dir", str(Path(checkpoint_dir).resolve())]
    from fluidctl.runtime.pserver import __main__ as entry
    if token_file:
        entry.read_token_file(token_file)                  # fail here, not in the child
        argv += ["--token-file", str(Path(token_file).resolve())]
    generate = not token_file and not os.environ.get(envs.JOB_TOKEN)
    if port == 0 and (daemon or generate):
        raise UsageError("--daemon needs a fixed port" if daemon else
                         "without a job token, --port 0 leaves trainers no way to find the "
                         "generated one", "pass --port, e.g. --port 7164"
                         + ("" if daemon else ", or --token-file"))
    _ensure_state_dir()
    if port:
        _refuse_if_running(port)
    token_path = None
    if generate:                       # no server ever runs without a token: make one
        token_path = paths.pserver_token_file(port)
        _write_private(token_path, secrets.token_hex(32) + "\n")
        argv += ["--token-file", str(token_path)]
        console().print(
            f"job token written to {token_path} (trainers: export "
            f"{envs.JOB_TOKEN}=$(cat {token_path}))", markup=False)
    if not daemon:
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s pserver %(levelname)s "
                            "%(message)s")
        args = entry.build_parser().parse_args(argv + ["--no-parent-watch"])
        try:
            code = entry.serve(entry.config_from(args, os.environ))
        finally:
            if token_path is not None:
                token_path.unlink(missing_ok=True)
        sys.exit(code)
    argv.append("--no-parent-watch")
    try:
        endpoint, pid, log = _spawn_daemon(argv, port)
    except FluidctlError:
        if token_path is not None:
            token_path.unlink(missing_ok=True)
        raise
    console().print(f"pserver started: {endpoint} (pid {pid}); log {log}; "
                     f"stop with: fluidctl pserver stop --port {port}", markup=False)


def _ensure_state_dir() -> None:
    where = paths.state_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use the state directory {where}: {exc.strerror or exc}",
                         "set FLUIDCTL_STATE_DIR to a writable directory") from None


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _refuse_if_running(port: int) -> None:
    record = _load_record(paths.pserver_state_file(port))
    if record and _alive(record):
        raise UsageError(f"a pserver already runs on port {port} (pid {record['pid']})",
                         f"stop it first: fluidctl pserver stop --port {port}")


def _spawn_daemon(argv: List[str], port: int):
    """Start the server detached; return once it listens (or raise with its last words)."""
    log = paths.pserver_log_file(port)
    log.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fluidctl.runtime.pserver", *argv, "--ready-fd",
             str(write_fd), "--log-file", str(log)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,), start_new_session=True, close_fds=True)
    os.close(write_fd)
    line = b""
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while b"\n" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([read_fd], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(read_fd, 256)
            if not chunk:
                break
            line += chunk
    finally:
        os.close(read_fd)
    if b"\n" in line:
        return line.decode().strip(), proc.pid, log
    if proc.poll() is None:
        proc.terminate()
    code = proc.wait()
    last = _last_error(log)
    if last is None:        # its words did not reach the log: most often a full disk
        where = log.parent
        full = _disk_full(where)
        raise FluidctlError(f"pserver on port {port} did not start: it exited with code {code} "
                            f"and its log {log} is empty"
                            + (f": no space left in {where}" if full else ""),
                            f"free space in {where}, or set FLUIDCTL_STATE_DIR to another "
                            "directory" if full else "run it without --daemon to see why",
                            exit_code=code if code else 1)
    raise FluidctlError(f"pserver on port {port} did not start: {last}",
                        f"see {log}", exit_code=code if code else 1)


def _disk_full(where: Path) -> bool:
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    return st.f_bavail == 0 or (st.f_favail == 0 and st.f_files > 0)


def _last_error(log: Path) -> Optional[str]:
    """The server's last error line in ``log`` (its last line), None if the log is empty."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    return lines[-1] if lines else None


# --- status -------------------------------------------------------------------------------

def _load_record(path: Path) -> Optional[dict]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def _alive(record: dict) -> bool:
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
    """Every state record, with ``state`` set to running or dead."""
    out = []
    for path in sorted(paths.state_dir().glob("pserver-*.json")):
        record = _load_record(path)
        if record is not None:
            record["state"] = "running" if _alive(record) else "dead"
            launcher = record.get("launcher_pid")
            if record["state"] == "running" and isinstance(launcher, int) and not _pid_alive(
                    launcher):
                record["state"] = "orphaned"         # its launcher died; it is stopping
            record["record"] = str(path)
            out.append(record)
    return sorted(out, key=lambda r: r.get("port", 0))


@pserver.command("status")
@click.option("--json", "as_json", is_flag=True,
              help="Print the state records as JSON, e.g. fluidctl pserver status --json.")
def status(as_json):
    """List pservers started on this machine (from their state records).

    \b
    Example:
      fluidctl pserver status --json | jq '.[].step'
    """
    found = records()
    if as_json:
        click.echo(json.dumps(found, indent=1))
        return
    out = console()
    if not found:
        out.print(f"no pservers (state directory {paths.state_dir()})", markup=False)
        return
    from rich.table import Table
    table = Table(title="fluidctl pservers")
    for column in ("endpoint", "pid", "state", "id", "mode", "trainers", "params", "rows",
                   "held", "step", "applied", "checkpoint dir"):
        table.add_column(column, overflow="fold")
    for r in found:
        connected = r.get("trainers_connected") or []
        table.add_row(
            str(r.get("endpoint")), str(r["pid"]),
            r["state"] if r["state"] == "running" else f"[red]{r['state']}[/]",
            str(r.get("pserver_id", "")), "sync" if r.get("sync", True) else "async",
            f"{len(connected)}/{r.get('trainers', '?')}", str(r.get("params", 0)),
            str(r.get("sparse_rows", 0)), human_bytes(int(r.get("bytes", 0))),
            str(r.get("step", 0)), str(r.get("applied", 0)), str(r.get("checkpoint_dir") or "-"))
    out.print(table)


# --- stop ---------------------------------------------------------------------------------

@pserver.command("stop")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Stop the pserver listening on this port, e.g. --port 7164.")
@click.option("--all", "stop_all", is_flag=True, help="Stop every pserver listed by status.")
@click.option("--timeout", type=seconds(0, 86400, "--timeout 120"), default=30.0, show_default=True,
              help="Seconds to wait for each to checkpoint and exit, e.g. --timeout 120.")
def stop(port, stop_all, timeout):
    """Stop pservers cleanly (SIGTERM: they checkpoint, then exit).

    \b
    Examples:
      fluidctl pserver stop --port 7164
      fluidctl pserver stop --all
    """
    if (port is None) == (not stop_all):
        raise UsageError("say which pservers to stop", "pass --port P or --all")
    targets = records()
    if port is not None:
        targets = [r for r in targets if r.get("port") == port]
        if not targets:
            raise UsageError(f"no pserver on port {port}", "see fluidctl pserver status")
    out = console()
    failed = []
    for r in targets:
        if r["state"] == "dead":
            log = _remove_record(r, clean=False)
            out.print(f"{r.get('endpoint')}: was not running (stale record removed"
                      + (f"; its log: {log})" if log else ")"), markup=False)
            continue
        if _terminate(r["pid"], timeout):
            log = _remove_record(r, clean=True)
            out.print(f"{r.get('endpoint')}: stopped (pid {r['pid']})"
                      + (f"; it logged warnings or errors, its log is kept: {log}" if log
                         else ""), markup=False)
        else:
            failed.append(r)
    if failed:
        pids = " ".join(str(r["pid"]) for r in failed)
        raise FluidctlError(f"{len(failed)} pserver(s) did not exit within {timeout:.0f} s",
                            f"wait longer with --timeout, or kill -9 {pids}", exit_code=1)


def _terminate(pid: int, timeout: float) -> bool:
    import psutil
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
        return True
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False


def _remove_record(record: dict, clean: bool) -> Optional[Path]:
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
