"""Test helper: start pservers on this machine as subprocesses, with the launcher's environment
contract.

For tests and benchmarks (bench/pserver.py) that need a small pserver cluster without
``fluidctl train --mode pserver``: free ports are found by binding port 0, each server is
``python -m fluidctl.runtime.pserver`` with ``fluidctl.envs.pserver_env`` and reports through
a pipe once it listens.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from fluidctl import envs
from fluidctl.net import free_ports  # noqa: F401  (tests and bench use it here)


def role_env(role: str, index: int, endpoints: Sequence[str], trainers: int, sync: bool,
             token: Optional[str], extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """os.environ plus the pserver-mode contract for one process."""
    env = dict(os.environ)
    env.update(envs.pserver_env(role=role, index=index, trainers=trainers,
                                pserver_endpoints=list(endpoints), sync=sync, token=token))
    env.update(extra or {})
    return env


def start_pserver(index: int, endpoints: Sequence[str], trainers: int, *, sync: bool = True,
                  token: Optional[str] = None, args: Sequence[str] = (),
                  log_path: Optional[str] = None, timeout: float = 30.0,
                  extra_env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start pserver ``index`` of ``endpoints`` and return once it listens."""
    read_fd, write_fd = os.pipe()
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fluidctl.runtime.pserver", "--ready-fd", str(write_fd),
             *args],
            env=role_env(envs.ROLE_PSERVER, index, endpoints, trainers, sync, token, extra_env),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
        if log_path:
            out.close()
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout)
        line = os.read(read_fd, 256) if ready else b""
    finally:
        os.close(read_fd)
    if not line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"pserver {index} ({endpoints[index]}) did not start"
                           + (f"; see {log_path}" if log_path else ""))
    return proc


def stop(procs: Sequence[subprocess.Popen], timeout: float = 30.0) -> List[int]:
    """SIGTERM each, wait; return the exit codes (KILL after ``timeout``)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    codes = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes
