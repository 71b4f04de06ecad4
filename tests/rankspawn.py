"""Start N ranks of a script on this machine with the collective contract, for tests and benches.

Each rank's environment comes from ``fluidctl.envs.collective_env`` (free ports found by binding
port 0); ``hosts`` lets ranks pretend to live on different nodes (127.0.0.1, 127.0.0.2, ...).
``run`` waits with a deadline and kills every rank on failure or timeout.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from fluidctl import envs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_envs(n: int, hosts: Optional[Sequence[str]] = None, token: Optional[str] = "test-token",
              extra: Optional[Dict[str, str]] = None,
              gpus: Sequence[str] = ()) -> List[Dict[str, str]]:
    """The environment of each of ``n`` ranks; ``hosts[r]`` is rank r's endpoint address."""
    hosts = list(hosts or ["127.0.0.1"] * n)
    endpoints = [f"{h}:{free_port(h)}" for h in hosts]
    master = f"127.0.0.1:{free_port()}"
    node_order = list(dict.fromkeys(hosts))
    out = []
    for r in range(n):
        local = [i for i in range(n) if hosts[i] == hosts[r]]
        env = dict(os.environ)
        env.pop(envs.JOB_TOKEN, None)
        env.update(envs.collective_env(
            rank=r, world_size=n, local_rank=local.index(r), local_size=len(local),
            nnodes=len(node_order), endpoints=endpoints, master=master,
            gpus_on_node=list(gpus), token=token, cores=os.cpu_count() or 1))
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.update(extra or {})
        out.append(env)
    return out


@dataclass
class Result:
    returncodes: List[int]
    outputs: List[str]

    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)

    def __str__(self) -> str:
        return "\n".join(f"--- rank {r} (exit {rc}) ---\n{out}"
                         for r, (rc, out) in enumerate(zip(self.returncodes, self.outputs)))


STARTED: set = set()        # pids of the ranks this process started (see shm_segments)


class Ranks:
    """Popen of each rank; output to temp files so a full pipe never blocks a rank."""

    def __init__(self, argv: Sequence[str], environments: Sequence[Dict[str, str]], tmpdir: str):
        self.logs = [os.path.join(tmpdir, f"rank{r}.log") for r in range(len(environments))]
        self.procs = []
        for env, log in zip(environments, self.logs):
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-u", *argv], env=env, stdout=out,
                    stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True))
                STARTED.add(self.procs[-1].pid)

    def wait(self, timeout: float, kill_on_failure: bool = True,
             until: Optional[Sequence[int]] = None) -> Result:
        """Wait for every rank (or only the ranks in ``until``), then kill what is left."""
        deadline = time.monotonic() + timeout
        until = range(len(self.procs)) if until is None else until
        while time.monotonic() < deadline:
            codes = [p.poll() for p in self.procs]
            if all(codes[r] is not None for r in until):
                break
            if kill_on_failure and any(c not in (None, 0) for c in codes):
                # give the others a moment to report their own error, then stop them
                grace = time.monotonic() + min(30.0, timeout)
                while time.monotonic() < min(grace, deadline) and any(
                        p.poll() is None for p in self.procs):
                    time.sleep(0.05)
                break
            time.sleep(0.02)
        self.kill()
        return Result([p.wait() for p in self.procs], [self._read(l) for l in self.logs])

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def _read(path: str) -> str:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")


def run(argv: Sequence[str], n: int, tmpdir: str, timeout: float = 60.0,
        until: Optional[Sequence[int]] = None, **kw) -> Result:
    return Ranks(argv, rank_envs(n, **kw), str(tmpdir)).wait(timeout, until=until)


def shm_segments() -> set:
    """fluidctl's shared-memory files in /dev/shm made by ranks this process started (there
    should be none after a run: segments are unlinked as soon as every local rank has mapped
    them). A segment's name carries its creator's pid; the other pytest workers' ranks make
    theirs at the same time, and one of those counted as this test's leak."""
    from fluidctl.runtime.collective.shm import PREFIX, shm_dir

    def creator(name: str) -> int:
        parts = name[len(PREFIX):].rsplit("-", 2)
        return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else -1
    return {name for name in os.listdir(shm_dir())
            if name.startswith(PREFIX) and creator(name) in STARTED}


def results(result: Result) -> List[dict]:
    """The ``RESULT {json}`` line of each rank (None where a rank printed none)."""
    import json
    out = []
    for text in result.outputs:
        lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
        out.append(json.loads(lines[-1][7:]) if lines else None)
    return out
