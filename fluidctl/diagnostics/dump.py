"""``fluidctl dump``, without click: every rank's Python stack of a running job, on demand.

The running launcher (``fluidctl train``) keeps its pid in LOG_DIR/job.json; ``run`` sends it
``DUMP_REQUEST``, the launcher takes every rank's stack on every node (the same code as
``--hang-timeout``: py-spy, else the runtime's faulthandler signal) into LOG_DIR/dump-<time>/,
and ``run`` prints the grouped summary it wrote there. The job keeps running.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from fluidctl.errors import FluidctlError, UsageError
from fluidctl.paths import DEFAULT_LOG_DIR, LogLayout

# what the launcher (launch/run.py) takes as "dump now": SIGURG, ignored by a process that does
# not handle it (SIGUSR1 is a checkpoint request, Slurm's warning signal)
DUMP_REQUEST = signal.SIGURG


def _dump_dirs(root: Path):
    return {p for p in root.glob("dump-*") if (p / "summary.txt").exists()}


def launcher_pid(layout: LogLayout, log_dir: str) -> int:
    """The pid of the job's launcher, which must run on this machine."""
    import json
    try:
        state = json.loads(layout.job_state.read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"no running job in {log_dir} (no {layout.job_state})",
                         "pass the --log-dir the job was started with") from None
    host = state.get("host")
    if host and host != os.uname().nodename:
        job = state.get("slurm_job_id")
        there = (f"srun --jobid {job} --overlap -w {host} fluidctl dump --log-dir {log_dir}"
                 if job else f"ssh {host} fluidctl dump --log-dir {log_dir}")
        raise UsageError(f"the job in {log_dir} has its launcher on {host}, not on this machine",
                         f"run it there: {there}")
    return pid


def signal_launcher(layout: LogLayout, log_dir: str, sig: int, command: str) -> int:
    """Send ``sig`` (0: none, a check) to the running launcher of the job in ``log_dir``;
    its pid. One line when there is none or it is not ours to signal."""
    pid = launcher_pid(layout, log_dir)
    try:
        os.kill(pid, 0)
        if sig:
            os.kill(pid, sig)
    except ProcessLookupError:
        raise UsageError(f"the job in {log_dir} is not running any more (launcher pid {pid} "
                         "is gone)", "start it again, or look at its logs") from None
    except PermissionError:
        raise UsageError(f"may not signal the job's launcher (pid {pid})",
                         f"run {command} as the user who started the job") from None
    return pid


def run(log_dir: str = DEFAULT_LOG_DIR, timeout: float = 60.0) -> None:
    """Ask the launcher of the job in ``log_dir`` for every rank's stack; print the summary
    once it is written (exit 1 if none comes within ``timeout`` seconds)."""
    layout = LogLayout(Path(log_dir))
    before = _dump_dirs(layout.root)
    signal_launcher(layout, log_dir, DUMP_REQUEST, "fluidctl dump")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = _dump_dirs(layout.root) - before
        if new:
            where = max(new)
            print((where / "summary.txt").read_text(), end="")
            print(f"  every rank's full stack: {where}/", flush=True)
            return
        time.sleep(0.1)
    raise FluidctlError(f"no stacks from the job in {log_dir} within {timeout:g}s",
                        f"see {layout.launch}; raise --timeout", exit_code=1)
