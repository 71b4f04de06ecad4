"""Jobs over many nodes: SSH (paramiko) or Fabric.

Before anything starts every node is checked in parallel (reachable, authenticated, the same
Python and fluidctl): one bad node is an error and nothing runs anywhere. Then each node runs
``fluidctl node-agent``, the same supervisor as the local launcher, with its share of the plan;
the agents stream every log line back, which lands in LOG_DIR/<host>/, and the launcher's own
supervisor treats each agent as one handle: a failure on any node (or a lost connection) stops
every node within the grace period, and restarts restart every node.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from fluidctl.backends.base import Failure
from fluidctl.commands.agent import BEAT_TAG, FAILURE_TAG, SAY_TAG, parse_line, tag_for
from fluidctl.errors import FluidctlError, UsageError
from fluidctl.launch.hosts import Host
from fluidctl.launch.plan import Plan, ProcSpec

PORT_PROBE = ("import socket,sys;n=int(sys.argv[1]);s=[socket.socket() for _ in range(n)];"
              "[x.bind(('',0)) for x in s];print(' '.join(str(x.getsockname()[1]) for x in s))")


def node_class(backend: str):
    if backend == "fabric":
        from fluidctl.backends.fabric import FabricNode
        return FabricNode
    from fluidctl.backends.ssh import SSHNode
    return SSHNode


def preflight(hosts: Sequence[Host], *, ssh_config, accept_new: bool, python: str,
              remote_dir: str, timeout: float):
    """Resolve and check every node; raise a one-line error naming each node that failed.
    Returns (resolved hosts, ssh targets, checks)."""
    from fluidctl.backends.ssh import check_nodes
    from fluidctl.launch.sshconfig import resolve_hosts
    resolved, targets = resolve_hosts(hosts, ssh_config, accept_new)
    checks = check_nodes(resolved, timeout=timeout, python=python, remote_dir=remote_dir,
                         targets=targets)
    bad = [c for c in checks if not c.ok]
    if bad:
        raise UsageError("; ".join(f"node {c.host}: {c.reason}" for c in bad),
                         "fix the node(s) or the hostfile; 'fluidctl cluster check' shows "
                         "every node; nothing was started")
    return resolved, targets, checks


def remote_ports(node, python: str, count: int, timeout: float) -> List[int]:
    """``count`` ports that were free on the node just now (a remote reservation cannot be
    held across SSH; --started-port gives fixed ones instead)."""
    result = node.run([python, "-c", PORT_PROBE, str(count)], timeout=timeout)
    ports = [int(p) for p in result.stdout.split()]
    if result.exit_code != 0 or len(ports) != count:
        raise FluidctlError(f"could not find free ports on {node.host.name}: "
                            f"{result.stderr.strip() or result.stdout.strip()}",
                            "pass --started-port P to use fixed ports", exit_code=1)
    return ports


class RemoteAgent:
    """One node's agent seen as a supervisor handle (backends.base.Handle)."""

    critical = True
    service = False

    def __init__(self, node, label: str, procs: Sequence[ProcSpec], spec: dict, *,
                 python: str, remote_dir: str, launch_log):
        self.node, self.label, self.host = node, f"node {label}", label
        self.launch_log = launch_log
        self.copies = {tag_for(p.role, p.rank): p.log for p in procs}
        first_trainer = next((p for p in procs if p.role == "trainer"), procs[0])
        self.log = first_trainer.log
        self._files: Dict[str, object] = {}
        self._lock = threading.Lock()
        self._record: Optional[dict] = None
        self._tail = deque(maxlen=20)
        self._lost = ""
        plan_file = f"/tmp/fluidctl-plan-{uuid.uuid4().hex}.json"
        with node.sftp.open(plan_file, "w") as f:
            f.chmod(0o600)
            f.write(json.dumps(spec))
        self.proc = node.start([python, "-m", "fluidctl", "node-agent", "--plan-file", plan_file],
                               on_line=self._line, cwd=remote_dir, report_pid=True)
        self.pid = self.proc.wait_pid(timeout=node.timeout)

    def _line(self, stream: str, line: str) -> None:
        parsed = parse_line(line) if stream == "stdout" else None
        if parsed is None:
            self._tail.append(line)
            self.launch_log(f"[{self.host}] {line}")
            return
        tag, text = parsed
        if tag in self.copies:
            with self._lock:
                f = self._files.get(tag)
                if f is None:
                    f = self._files[tag] = open(self.copies[tag], "a", encoding="utf-8")
                f.write(text + "\n")
                f.flush()
        elif tag == FAILURE_TAG:
            self._record = json.loads(text)
        elif tag == SAY_TAG:
            self.launch_log(f"[{self.host}] {text}")
        elif tag != BEAT_TAG:
            self.launch_log(f"[{self.host}] unknown agent line: {line}")

    def fileno(self) -> int:
        return -1

    def poll(self) -> Optional[int]:
        from fluidctl.backends.ssh import ConnectionLost
        try:
            return self.proc.poll()
        except ConnectionLost as exc:
            self._lost = str(exc)
            return 255

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)      # the agent stops its ranks (TERM, grace, KILL)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGINT)       # a second signal: the agent kills at once

    def failure(self) -> Failure:
        code = self.proc.poll() if not self._lost else 255
        if self._record:
            r = self._record
            log = self.copies.get(r["label"].replace("trainer ", "trainer ").strip(), self.log)
            return Failure(r["label"], self.host, r["returncode"], log, r.get("pid"),
                           r.get("when") or time.time(), r.get("detail", ""))
        detail = self._lost and f"SSH connection lost ({self._lost})" or (
            "node agent failed: " + (" | ".join(list(self._tail)[-3:]) or f"exit {code}"))
        return Failure(self.label, self.host, code if code is not None else 255, self.log,
                       self.pid, detail=detail)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
        self.proc.close()


def agent_spec(the_plan: Plan, node_index: int, *, attempt: int, max_restarts: int,
               grace: float, label: str) -> dict:
    procs = [replace(p, log="") for p in the_plan.on_node(node_index)]
    return {"procs": [p.to_json() for p in procs], "attempt": attempt,
            "max_restarts": max_restarts, "grace": grace, "log_dir": the_plan.job.log_dir,
            "host": label}


def shell_quote_argv(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def relative_script(script: str, cwd: str) -> str:
    """A script inside the working directory is named relative to it, so it is found under
    --remote-dir on the nodes; others keep their absolute path."""
    absolute = os.path.abspath(script)
    rel = os.path.relpath(absolute, cwd)
    return absolute if rel.startswith("..") else rel


def run(job, hosts: Sequence[Host], targets, *, backend: str, remote_dir: str,
        ssh_timeout: float, started_port: Optional[int], layout, grace_period: float,
        max_restarts: int, tee: str, log_tail: int, dry_run: bool, as_json: bool) -> int:
    """Connect, lay out ports, plan, then supervise one agent per node."""
    from fluidctl.backends.ssh import connect_all
    from fluidctl.launch import run as running
    from fluidctl.launch.plan import plan as make_plan
    from fluidctl.launch.supervisor import LaunchLog, RunOptions

    connected = connect_all(hosts, targets, timeout=ssh_timeout, node_class=node_class(backend))
    try:
        if connected.failures:
            raise UsageError("; ".join(f"node {n}: {r}" for n, r in connected.failures.items()),
                             "nothing was started; 'fluidctl cluster check' shows every node")
        nodes = [connected.nodes[h.name] for h in hosts]
        ports = {}
        for i, node in enumerate(nodes):
            needed = job.ports_needed(i)
            ports[i] = (list(range(started_port, started_port + needed)) if started_port
                        else remote_ports(node, job.python, needed, ssh_timeout))
        the_plan = make_plan(job, ports)
        if dry_run:
            from fluidctl.commands.train import _print_plan
            _print_plan(the_plan, as_json)
            return 0
        layout.create()
        for h in hosts:
            layout.for_host(h.name).create()
        running.write_endpoints(layout, the_plan)
        launch_log = LaunchLog(str(layout.launch))
        launch_log(f"fluidctl job over {backend}: {len(the_plan.trainers)} trainer(s) on "
                   f"{len(hosts)} node(s), mode {job.mode}, master {the_plan.master}")

        def start(attempt: int):
            handles = []
            for i, (host, node) in enumerate(zip(hosts, nodes)):
                if not the_plan.on_node(i):
                    continue
                spec = agent_spec(the_plan, i, attempt=attempt, max_restarts=max_restarts,
                                  grace=grace_period, label=host.name)
                handles.append(RemoteAgent(node, host.name, the_plan.on_node(i), spec,
                                           python=job.python, remote_dir=remote_dir,
                                           launch_log=launch_log))
            return handles

        from fluidctl.console import print_failure
        try:
            result = running.run_supervised(
                start, logs=[p.log for p in the_plan.procs], launch_log=launch_log,
                options=RunOptions(grace_period, max_restarts),
                sources=running.echo_sources(the_plan.procs, tee),
                report=lambda failure: print_failure(failure, log_tail))
        finally:
            launch_log.close()
        return result.exit_code
    finally:
        connected.close()
