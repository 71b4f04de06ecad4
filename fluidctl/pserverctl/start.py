"""``fluidctl pserver start``: run ``python -m fluidctl.runtime.pserver`` in the foreground, or
detached (new session, log in the state directory) and return once it listens. No server runs
without a job token: without one given, one is generated into the state directory."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from fluidctl import envs, paths
from fluidctl.errors import FluidctlError, UsageError
from fluidctl.pserverctl.records import ensure_state_dir, refuse_if_running, write_private

START_TIMEOUT = 30.0


def run(host: str = "0.0.0.0", port: int = 7164, ports_num: int = 1,
        ports_num_for_sparse: int = 0, trainers: Optional[int] = None,
        sync: Optional[bool] = None, pserver_id: Optional[int] = None,
        checkpoint_dir: Optional[str] = None, checkpoint_every: int = 0,
        token_file: Optional[str] = None, max_frame_mb: int = 1024,
        daemon: bool = False) -> None:
    """Start a parameter server (see ``fluidctl pserver start --help``)."""
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
    if token_file:
        from fluidctl.runtime.pserver import __main__ as entry
        entry.read_token_file(token_file)                  # fail here, not in the child
        argv += ["--token-file", str(Path(token_file).resolve())]
    generate = not token_file and not os.environ.get(envs.JOB_TOKEN)
    if port == 0 and (daemon or generate):
        raise UsageError("--daemon needs a fixed port" if daemon else
                         "without a job token, --port 0 leaves trainers no way to find the "
                         "generated one", "pass --port, e.g. --port 7164"
                         + ("" if daemon else ", or --token-file"))
    ensure_state_dir()
    if port:
        refuse_if_running(port)
    token_path = _generate_token(port) if generate else None
    if token_path is not None:
        argv += ["--token-file", str(token_path)]
    if not daemon:
        try:
            code = _serve(argv)
        finally:
            if token_path is not None:
                token_path.unlink(missing_ok=True)
        sys.exit(code)
    try:
        endpoint, pid, log = _spawn_daemon(argv + ["--no-parent-watch"], port)
    except FluidctlError:
        if token_path is not None:
            token_path.unlink(missing_ok=True)
        raise
    _print(f"pserver started: {endpoint} (pid {pid}); log {log}; "
           f"stop with: fluidctl pserver stop --port {port}")


def _print(text: str) -> None:
    from fluidctl.console import console
    console().print(text, markup=False)


def _generate_token(port: int) -> Path:
    """A new random job token in the state directory, readable by this user only."""
    import secrets
    token_path = paths.pserver_token_file(port)
    write_private(token_path, secrets.token_hex(32) + "\n")
    _print(f"job token written to {token_path} (trainers: export "
           f"{envs.JOB_TOKEN}=$(cat {token_path}))")
    return token_path


def _serve(argv: List[str]) -> int:
    """The server in this process, until it stops; its exit code."""
    import logging
    from fluidctl.runtime.pserver import __main__ as entry
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pserver %(levelname)s "
                        "%(message)s")
    args = entry.build_parser().parse_args(argv + ["--no-parent-watch"])
    return entry.serve(entry.config_from(args, os.environ))


def _spawn_daemon(argv: List[str], port: int):
    """Start the server detached; return once it listens (or raise with its last words)."""
    import select
    import subprocess
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
