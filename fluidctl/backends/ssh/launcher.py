"""The ``ssh`` and ``fabric`` backends: SSH (paramiko) or Fabric connections, one node agent
per node (``SSHLauncher``, ``FabricLauncher``; the node side is ``fluidctl.node.agent``).

Every node is connected to and started on in parallel; each node's agent
(``python -m fluidctl.node.agent``) first reports on its node (versions, disk, GPUs, free
ports); ``prepare`` plans from those reports. If any node cannot be reached or
fails the check, the launcher says which and why in one line, closes every agent's stdin (they
exit without starting anything) and nothing runs anywhere. Otherwise each agent receives its
share of the plan on stdin and runs it with the same supervisor as the local launcher.
Every rank's log is LOG_DIR/<host>/workerlog.N (serverlog.N) here, written once: streamed back
line by line and written by the launcher, or, when the agent finds the launcher's shared
marker (``LogLayout.shared_marker``, a fresh random name per job) at its own LOG_DIR, written
there by the rank itself (a shared file system; nothing is streamed). The launcher's own
supervisor sees each agent as one handle: a failure on any node (or a lost connection) stops
every node within the grace period, and restarts restart every node.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from fluidctl import __version__
# the conversation with a node agent (one tagged line each way): fluidctl/agentproto.py, which
# is all of this side the agent imports
from fluidctl.agentproto import (AGENT_MODULE, BEAT_COMMAND, BEAT_EVERY, BEAT_MISSES,
                                 BEAT_TAG, CHECKPOINT_COMMAND, CR_MARK, DOCTOR_TAG, DUMP_COMMAND,
                                 ENDS_TAG, FAILURE_TAG, PROBE_TAG, SAY_TAG, STACKS_TAG,
                                 STEPS_TAG, STOP_COMMAND, WATCH_EVERY, Ends, NodeShare,
                                 ProcessEnd, Probe, RecordError, parse_line, tag_for)
from fluidctl.backends.base import BaseLauncher
from fluidctl.diagnostics.watch import Diagnostics, StackDump, local_activity
from fluidctl.errors import UsageError, node_failures
from fluidctl.diagnostics.failures import Failure, FailureKind
from fluidctl.planning import plan as planner
from fluidctl.planning.elastic import HostNodes
from fluidctl.planning.hosts import Host
from fluidctl.planning.plan import LaunchCommand, Plan, ProcSpec

def agent_argv(python: str, ports: int, venv: Optional[str] = None,
               host: str = "", beat: float = 0.0) -> List[str]:
    """The node agent's command; with ``venv``, run by that venv's python where it exists on
    the node (``cluster setup``'s environment), else by ``python``; ``beat``: the launcher
    beats on its stdin every ``beat`` seconds from the start (elastic jobs)."""
    argv = [python, "-m", AGENT_MODULE, "--ports", str(ports)]
    if beat:
        argv += ["--beat", f"{beat:g}"]
    if venv:
        from fluidctl.planning.venv import prefer_venv
        argv = prefer_venv(argv, venv, host)
    return argv


def node_class(backend: str):
    if backend == "fabric":
        from fluidctl.remote.fabric import FabricNode
        return FabricNode
    from fluidctl.remote.ssh import SSHNode
    return SSHNode


class RemoteAgent:
    """One node's agent, seen by the supervisor as a handle (backends.base.Handle)."""

    service = False

    def __init__(self, node, label: str, *, python: str, remote_dir: str, ports: int,
                 launch_log, venv: Optional[str] = None, beat: float = 0.0):
        from fluidctl.remote.ssh import RemoteProcess, shell_command
        self.node, self.label, self.host = node, f"node {label}", label
        self.launch_log = launch_log
        self.copies: Dict[str, str] = {}
        self.log = ""
        self._files: Dict[str, object] = {}
        self._lock = threading.Lock()
        self._probed = threading.Event()
        self.probe: Optional[Probe] = None
        self._record: Optional[Failure] = None
        self._tail = deque(maxlen=20)
        self._lost = ""
        self._lost_probe: Optional[str] = None  # probe_link's answer once the node is lost
        self.progress = 0                       # collectives completed on the node (beats)
        self.steps: dict = {}                   # the node's ranks' straggler sums (steps)
        self.ends: Optional[List[ProcessEnd]] = None    # the node's processes' final states
        self.ends_came = threading.Event()
        self._stacks: Optional[dict] = None
        self._stacks_came = threading.Event()
        self._doctor: Optional[list] = None
        self._doctor_came = threading.Event()
        # an elastic job's agent beats from its start (``beat``): BEAT_MISSES beats missed in
        # a row and the node is lost; its start-up (before its probe) may take the timeout
        self.beat_timeout = beat * BEAT_MISSES
        self.heard = time.monotonic() + node.timeout    # when the agent last said anything
        # our own channel, so stdin stays open: the plan goes there, and its closing tells the
        # agent that the launcher is gone
        self.channel = node.client.get_transport().open_session(timeout=node.timeout)
        self.channel.exec_command(shell_command(agent_argv(python, ports, venv, label, beat),
                                                cwd=remote_dir, report_pid=True))
        self.proc = RemoteProcess(node, self.channel, self._line, capture=False, report_pid=True)
        self.pid: Optional[int] = None
        # the supervisor waits on descriptors: a pipe that turns readable when the agent ends
        # (or its connection dies), so an end is noticed at once, not at the next poll
        self._ended_r, self._ended_w = os.pipe()
        threading.Thread(target=self._watch_end, daemon=True,
                         name=f"agent-end-{label}").start()

    def _watch_end(self) -> None:
        """Owns the pipe's write end (so it is never written after being closed). In an elastic
        job it also watches the agent's heartbeats (``beat_timeout``)."""
        while not self.channel.status_event.wait(WATCH_EVERY if self.beat_timeout else 0.5):
            transport = self.channel.get_transport()
            if self.channel.closed or transport is None or not transport.is_active():
                break
            silent = time.monotonic() - self.heard
            if self.beat_timeout and silent > self.beat_timeout:
                self.declare_lost(f"no heartbeat from its agent for {silent:.1f}s")
                break
        try:
            os.write(self._ended_w, b"x")
        except OSError:                     # the read end is gone: nobody is waiting
            pass
        os.close(self._ended_w)

    def declare_lost(self, why: str) -> None:
        """The node is gone: remember why, and close the connection so that nothing waits
        on it (a frozen or cut-off node would hold a reader for minutes)."""
        if self._lost:
            return
        self._lost = why
        self.node.lost_why = why        # the node's other agents (a standby) are lost with it
        self.launch_log(f"node {self.host} declared lost: {why}")
        transport = self.node.client.get_transport() if self.node.client else None
        if transport is not None:
            transport.close()

    def lost_reason(self) -> str:
        """Why this node counts as lost (empty when it does not): its connection or heartbeat
        is gone, its agent was killed before it could report, or its ranks died of a signal
        that kills nodes' work from outside (SIGKILL: the OOM killer, a dying node; SIGBUS)."""
        code = self.poll()
        if self._lost:
            return self._lost
        if code is None or code == 0:
            return ""
        if self._record is None:
            return "its agent was killed" if code in _KILLED else ""
        if self._record.returncode in _KILLED:
            return f"its ranks died ({self._record.label}: {self._record.reason})"
        return ""

    def beat(self) -> None:
        """The launcher's heartbeat on the agent's stdin (elastic jobs)."""
        from fluidctl.remote.ssh import NODE_LOST
        if self._lost or self.channel.closed:
            return
        try:
            if self.channel.send_ready():
                self.channel.sendall((BEAT_COMMAND + "\n").encode())
        except NODE_LOST:
            pass

    # --- the conversation ------------------------------------------------------------------
    def wait_probe(self, timeout: float) -> Optional[Probe]:
        """The node's report, or None if the agent did not give one (see ``why_no_probe``)."""
        deadline = time.monotonic() + timeout
        while not self._probed.wait(0.05):
            if time.monotonic() > deadline or self.channel.exit_status_ready() \
                    or self.channel.closed:
                break
        if self.probe is None:
            self._probed.wait(0.5)         # an agent that just exited: let its output arrive
        self.pid = self.proc.wait_pid(timeout=1.0)
        return self.probe

    def why_no_probe(self, python: str, remote_dir: str, timeout: float) -> str:
        if not self.channel.exit_status_ready():
            return f"no answer from fluidctl on the node within {timeout:g}s (raise --ssh-timeout)"
        code = self.channel.recv_exit_status()
        said = " ".join(list(self._tail)[-2:])
        if code == 97:
            return (f"remote dir {remote_dir} does not exist (run fluidctl cluster sync, or pass "
                    "--remote-dir)")
        if code == 127:
            return f"python {python} not found there (pass --python with the remote interpreter)"
        if "No module named fluidctl" in said or "No module named 'fluidctl" in said:
            return (f"fluidctl {__version__} is not installed for {python} there (install the "
                    "same version on every node)")
        return f"node agent exited with code {code}: {said}"

    def send_plan(self, share: NodeShare, procs: Sequence[ProcSpec]) -> None:
        self.copies = {tag_for(p.role, p.rank): p.log for p in procs}
        for path in {os.path.dirname(p) for p in self.copies.values()}:
            os.makedirs(path or ".", exist_ok=True)     # a spare's first logs
        self.log = next((p.log for p in procs if p.role == "trainer"), procs[0].log)
        self.channel.sendall((share.to_wire() + "\n").encode())

    def doctor(self, request: dict, timeout: float) -> Optional[List[str]]:
        """The node's rendezvous problems (backends/doctor.py), None without an answer."""
        from fluidctl.remote.ssh import NODE_LOST
        self._doctor, self._doctor_came = None, threading.Event()
        try:
            self.channel.sendall((json.dumps({"doctor": request}) + "\n").encode())
        except NODE_LOST:
            return None
        self._doctor_came.wait(timeout)
        return self._doctor

    def send_signal(self, sig: int) -> None:
        """A checkpoint request: the agent creates its node's request file and sends ``sig``
        to its ranks (not to itself: it stays to report how they ended)."""
        from fluidctl.remote.ssh import NODE_LOST
        try:
            self.channel.sendall(f"{CHECKPOINT_COMMAND} {signal.Signals(sig).name[3:]}\n"
                                 .encode())
        except NODE_LOST:
            self.terminate()

    def ask_stacks(self) -> None:
        """Ask the agent for its ranks' stacks (answered by a ``stacks`` record)."""
        from fluidctl.remote.ssh import NODE_LOST
        self._stacks, self._stacks_came = None, threading.Event()
        try:
            self.channel.sendall((DUMP_COMMAND + "\n").encode())
        except NODE_LOST:
            self._stacks_came.set()

    def stacks(self, timeout: float) -> Optional[dict]:
        self._stacks_came.wait(timeout)
        return self._stacks

    def abandon(self) -> None:
        """Tell an agent that nothing will run (EOF on its stdin) and let go of it."""
        from fluidctl.remote.ssh import NODE_LOST
        try:
            self.channel.shutdown_write()
        except NODE_LOST:
            pass
        self.proc.close()

    def _line(self, stream: str, line: str) -> None:
        self.heard = time.monotonic()
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
                # a progress bar's state ended with a lone \r on the node: keep it so
                f.write(text[:-len(CR_MARK)] + "\r" if text.endswith(CR_MARK) else text + "\n")
                f.flush()
        else:
            try:
                self._record_line(tag, text)
            except (RecordError, ValueError) as exc:    # not what this version sends
                self._tail.append(f"unreadable {tag} record: {exc}")
                self.launch_log(f"[{self.host}] unreadable {tag} record: {exc}")

    def _record_line(self, tag: str, text: str) -> None:
        """A record from the agent (RecordError or ValueError when it is malformed)."""
        if tag == PROBE_TAG:
            self.probe = Probe.from_wire(text)
            self._probed.set()
        elif tag == FAILURE_TAG:
            self._record = Failure.from_record(json.loads(text))
        elif tag == SAY_TAG:
            self.launch_log(f"[{self.host}] {text}")
        elif tag == BEAT_TAG:
            self.progress = int(text) if text.isdigit() else self.progress
        elif tag == STEPS_TAG:
            from fluidctl.diagnostics import stragglers
            self.steps = stragglers.from_wire(text)
        elif tag == STACKS_TAG:
            self._stacks = json.loads(text)
            self._stacks_came.set()
        elif tag == ENDS_TAG:
            self.ends = Ends.from_wire(text).ends
            self.ends_came.set()
        elif tag == DOCTOR_TAG:
            self._doctor = json.loads(text)
            self._doctor_came.set()
        else:
            self.launch_log(f"[{self.host}] unknown agent line: {tag}|{text}")

    # --- the Handle protocol ---------------------------------------------------------------
    def fileno(self) -> int:
        return self._ended_r

    def poll(self) -> Optional[int]:
        from fluidctl.remote.ssh import ConnectionLost
        if not self._lost and getattr(self.node, "lost_why", ""):
            self._lost = self.node.lost_why
        if self._lost:
            return 255
        try:
            return self.proc.poll()
        except ConnectionLost as exc:
            self._lost = str(exc)
            return 255

    def terminate(self) -> None:
        """The agent stops its ranks (TERM, grace, KILL): asked on its stdin in an elastic job
        (no new SSH session: a restart waits for this), else by a signal."""
        from fluidctl.remote.ssh import NODE_LOST
        if self.beat_timeout and not self._lost:
            try:
                self.channel.sendall((STOP_COMMAND + "\n").encode())
                return
            except NODE_LOST:
                pass
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGINT)       # a second signal: the agent kills at once

    def failure(self) -> Failure:
        if self._record:        # the agent's own report; the log is our copy of its log
            return replace(self._record, host=self.host,
                           log=self.copies.get(self._record.label, self.log))
        code = 255 if self._lost else self.poll()
        detail = (f"SSH connection lost ({self._lost})" if self._lost else
                  "node agent failed: " + (" | ".join(list(self._tail)[-3:]) or f"exit {code}"))
        failure = Failure(self.label, self.host, code if code is not None else 255, self.log,
                          self.pid, detail=detail)
        if self._lost and not self.beat_timeout:    # an elastic job goes on at once without it
            verdict = self.lost_verdict()
            if verdict is not None:
                failure.explanation, failure.kind = verdict.sentence, FailureKind(verdict.kind)
        return failure

    def lost_verdict(self):
        """Frozen node or partition for a lost connection, from one probe of the node's link
        (taken once: at most 2 x PROBE_TIMEOUT)."""
        from fluidctl.diagnostics.classify import lost_node
        if self._lost_probe is None:
            self._lost_probe = probe_link(self)
        return lost_node(self.host, self._lost_probe)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
        self.proc.close()
        if self._ended_r >= 0:
            os.close(self._ended_r)
            self._ended_r = -1


# an agent's or a rank's end that means the node's work was killed from outside (-9 as sshd
# reports a signal, 137 as a shell does; SIGBUS: the hardware)
_KILLED = frozenset((-int(signal.SIGKILL), 128 + int(signal.SIGKILL), -int(signal.SIGBUS),
                     128 + int(signal.SIGBUS)))


def node_dir(remote_dir: str, host: str) -> str:
    """--remote-dir on one node: '{host}' is the node's name (as in cluster sync's)."""
    return remote_dir.replace("{host}", host)


def bring_up(hosts: Sequence[Host], targets, *, backend: str, python: str, remote_dir: str,
             timeout: float, ports_wanted: Dict[str, int], launch_log,
             nodes: Optional[Dict[str, object]] = None, venv: Optional[str] = None,
             beat: float = 0.0, on_agent=None):
    """Connect to every node (unless ``nodes`` are connected already) and start its agent,
    each node on its own thread from start to probe; one bad node is a one-line error naming
    every node that failed, after every agent was told to exit and every connection closed.
    ``remote_dir``: '{host}' in it is each node's name. Returns ({name: node}, [agent per
    host])."""
    connected, agents, failures = start_agents(
        hosts, targets, backend=backend, python=python, remote_dir=remote_dir, timeout=timeout,
        ports_wanted=ports_wanted, launch_log=launch_log, nodes=nodes, venv=venv, beat=beat,
        on_agent=on_agent)
    if failures:
        raise node_failures("could not start the job", failures, len(hosts),
                            "fix the node(s) or the hostfile; 'fluidctl cluster check' shows "
                            "every node; nothing was started", error=UsageError)
    return connected, agents


def start_agents(hosts: Sequence[Host], targets, *, backend: str, python: str,
                 remote_dir: str, timeout: float, ports_wanted: Dict[str, int], launch_log,
                 nodes: Optional[Dict[str, object]] = None, venv: Optional[str] = None,
                 beat: float = 0.0, on_agent=None):
    """``bring_up`` without the error: ({name: node}, [agent per host], [(name, why)]); when
    any node failed, every agent was told to exit and the connections this call made (not
    ``nodes``') are closed. ``on_agent(agent)``: called as each agent starts (the launcher
    beats to it from then on)."""
    from fluidctl.remote.ssh import ConnectFailed, parallel
    cls = node_class(backend)
    given = nodes or {}

    def one(host: Host):
        where = node_dir(remote_dir, host.name)
        node = given.get(host.name)
        if node is None:
            node = cls(host, targets[host.name], timeout=timeout, timeout_option="--ssh-timeout")
            try:
                node.connect()
            except ConnectFailed as exc:
                return None, None, str(exc)
        try:
            agent = RemoteAgent(node, host.name, python=python, remote_dir=where,
                                ports=ports_wanted.get(host.name, 0), launch_log=launch_log,
                                venv=venv, beat=beat)
        except Exception as exc:
            return node, None, f"could not start fluidctl there: {exc}"
        if on_agent is not None:
            on_agent(agent)
        info = agent.wait_probe(timeout)
        if info is None:
            return node, agent, agent.why_no_probe(python, where, timeout)
        if info.fluidctl != __version__:
            return node, agent, (f"fluidctl {info.fluidctl} there, {__version__} here "
                                 "(install the same version on every node)")
        return node, agent, ""

    results = parallel(list(hosts), one)
    connected = {h.name: node for h, (node, _, _) in zip(hosts, results) if node is not None}
    agents = [agent for _, agent, _ in results]
    failures = [(h.name, why) for h, (_, _, why) in zip(hosts, results) if why]
    if failures:
        for agent in agents:
            if agent is not None:
                agent.abandon()
        for name, node in connected.items():
            if name not in given:
                node.close()
        connected = {name: node for name, node in connected.items() if name in given}
    return connected, agents, failures


def node_share(plan: Plan, node_index: int, *, attempt: int, max_restarts: int,
               grace: float, label: str, marker: str = "") -> NodeShare:
    """A node's share of the plan; ``marker``: the nonce of the launcher's shared marker
    (``LogLayout.shared_marker``), which tells the agent whether its LOG_DIR is ours."""
    procs = [replace(p, log="") for p in plan.on_node(node_index)]
    return NodeShare([p.to_json() for p in procs], plan.job.log_dir, label, attempt=attempt,
                     max_restarts=max_restarts, grace=grace, marker=marker)


def make_shared_marker(layout) -> str:
    """Make the launcher's shared marker in its (existing) log dir; returns its nonce."""
    nonce = os.urandom(16).hex()        # what secrets.token_hex reads, without its import
    os.close(os.open(layout.shared_marker(nonce), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    return nonce


class SSHLauncher(BaseLauncher):
    """``--backend ssh``: every node over paramiko, one node agent each. ``prepare`` connects
    and probes every node (a one-line error naming each bad node, nothing started); the
    connections stay open for ``start`` and are closed by ``close``."""
    name = "ssh"

    def __init__(self, log=None):
        super().__init__(log)
        self.hosts: List[Host] = []
        self.connected: Dict[str, object] = {}
        self.agents: List[RemoteAgent] = []
        self.config = None
        self.marker = ""            # the nonce of our shared marker in LOG_DIR, once made
        self.members = None         # an elastic job's membership (ElasticMembers)
        self.plan: Optional[Plan] = None    # the running world's plan (an elastic restart
                                            # makes a new one)

    @property
    def beat(self) -> float:
        """Seconds between the launcher's and the agents' heartbeats (0: not elastic)."""
        return BEAT_EVERY if self.members is not None else 0.0

    def prepare(self, config) -> Plan:
        from fluidctl.remote.sshconfig import resolve_hosts
        if not config.hosts:
            raise UsageError(f"--backend {self.name} needs nodes", "pass --hostfile or --hosts")
        self.config = config
        resolved, targets = resolve_hosts(list(config.hosts), config.ssh_config,
                                          config.accept_new_host_keys)
        self.hosts = resolved
        if HostNodes.of(config).elastic is not None:
            self.members = ElasticMembers(self, resolved, targets)
            self.hosts = self.members.first_world()
        wanted = self._ports_wanted(self.hosts)
        self.connected, self.agents = bring_up(
            self.hosts, targets, backend=self.name, python=config.interpreter,
            remote_dir=self.remote_dir, timeout=config.ssh_timeout, ports_wanted=wanted,
            launch_log=self.log, venv=config.node_venv, beat=self.beat,
            on_agent=self.members.track if self.members is not None else None)
        plan = self._plan(self.hosts, self.agents, wanted)
        self._rendezvous_doctor(plan)
        return plan

    def echo_sources(self, plan: Plan, tee: str, ranks=None):
        """An elastic job's console follows each echoed trainer rank to whichever node the
        current world put it on (rank 0's log moves when its node is lost)."""
        sources = super().echo_sources(plan, tee, ranks)
        if self.members is None:
            return sources
        from fluidctl.backends.base import RankLog, echo_prefix
        by_log = {p.log: p for p in plan.trainers}
        followed = []
        for path, prefix, *stream in sources:
            p = by_log.get(path)
            if p is not None:
                log = RankLog(lambda: self.plan or plan, p.rank, echo_prefix if prefix else None)
                path, prefix = log, log.prefix
            followed.append((path, prefix, *stream))
        return followed

    def _pservers(self, hosts: Sequence[Host]) -> List[int]:
        config = self.config
        return planner.pserver_counts(config.mode, config.pserver_endpoints, config.pservers,
                                      config.pserver_hosts, [h.name for h in hosts])

    def _ports_wanted(self, hosts: Sequence[Host]) -> Dict[str, int]:
        return {h.name: planner.ports_to_probe(h.slots if h.slots_given else None,
                                               self.config.nproc, k)
                for h, k in zip(hosts, self._pservers(hosts))}

    def _plan(self, hosts: Sequence[Host], agents: Sequence["RemoteAgent"],
              wanted: Dict[str, int]) -> Plan:
        """The plan over ``hosts``, from their agents' probes."""
        config = self.config
        nodes = [planner.remote_node(h.name, self.connected[h.name].peer_address or h.address,
                                     h.slots if h.slots_given else None, config.nproc,
                                     config.gpus, agent.probe.gpu_ids, k)
                 for h, agent, k in zip(hosts, agents, self._pservers(hosts))]
        job = config.job(nodes, planner.relative_script(config.script, os.getcwd()),
                         multi_node_logs=True)
        ports = {i: planner.node_ports(job.ports_needed(i), config.started_port,
                                       agent.probe.ports)
                 for i, agent in enumerate(agents)}
        commands = [LaunchCommand(h.name, agent_argv(config.interpreter, wanted[h.name],
                                                     config.node_venv, h.name, self.beat),
                                  cwd=node_dir(self.remote_dir, h.name))
                    for h in hosts]
        plan = planner.make_plan(job, ports, backend=self.name, commands=commands)
        self._socket_ifnames(config, plan, agents)
        if config.node_venv:    # each node's ranks run with its agent's python (its venv)
            from fluidctl.planning.venv import use_node_interpreters
            plan = use_node_interpreters(plan, [a.probe.executable for a in agents])
        return plan

    def _socket_ifnames(self, config, plan, agents) -> None:
        """Each node's processes get NCCL_SOCKET_IFNAME (``=name``, exact) and
        GLOO_SOCKET_IFNAME set to the interface that node is reached on, unless the user set
        either (backends/doctor.py)."""
        from fluidctl.backends.ssh import doctor
        if any(name in config.user_env for name in doctor.IFNAME_VARS):
            return
        names = doctor.node_ifnames([n.address for n in plan.job.nodes],
                                    [a.probe.ifaces for a in agents])
        for i, name in enumerate(names):
            if name is None:
                self.log(f"node {plan.job.nodes[i].label}: its network interface is "
                         "unknown: NCCL/GLOO_SOCKET_IFNAME not set there")
                continue
            for proc in plan.on_node(i):
                proc.env.update(doctor.ifname_env(name))
        self.log("NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME per node: " + ", ".join(
            f"{n.label}={name}" for n, name in zip(plan.job.nodes, names) if name))

    def _rendezvous_doctor(self, plan: Plan) -> None:
        """Ports free on every node, the master reachable from every node, MASTER_ADDR on
        node 0: one line per problem, and nothing starts."""
        import click
        from fluidctl.backends.ssh import doctor
        problems = doctor.examine(plan, self.hosts, self.agents, self.config.ssh_timeout)
        if problems:
            for line in problems:
                click.echo(f"error: {line}", err=True)
            raise UsageError(f"the rendezvous check found {len(problems)} problem(s)",
                             "fix the lines above; nothing was started")

    def diagnostics(self, config):
        """Ranks run under the node agents: their stacks come from a "dump" line to each
        agent, their progress from the agents' heartbeats."""
        self._diagnostics = AgentDiagnostics.for_job(config, launcher=self)
        return self._diagnostics

    @property
    def remote_dir(self) -> str:
        return self.config.remote_dir or os.getcwd()

    def start(self, plan: Plan, attempt: int) -> List[RemoteAgent]:
        """Hand every agent its share of the plan; a restart starts fresh agents over the
        same connections."""
        config = self.config
        if not self.marker:
            self.marker = make_shared_marker(config.layout)
        if self.members is not None:
            if attempt:         # the plan is made again, on the nodes left and spares
                plan = self.members.regroup(attempt)
                plan.write_endpoints(config.layout)
            self.plan = plan
        elif attempt:
            self.agents = bring_up(self.hosts, None, backend=self.name,
                                   python=config.interpreter, remote_dir=self.remote_dir,
                                   timeout=config.ssh_timeout, ports_wanted={},
                                   launch_log=self.log, nodes=self.connected,
                                   venv=config.node_venv)[1]
        handles = []
        for i, agent in enumerate(self.agents):
            procs = plan.on_node(i)
            if not procs:
                agent.abandon()
                continue
            share = node_share(plan, i, attempt=attempt, max_restarts=config.max_restarts,
                               grace=config.grace_period, label=self.hosts[i].name,
                               marker=self.marker)
            share.beat = self.beat
            share.checkpoint_signal = config.checkpoint_signal
            agent.send_plan(share, procs)
            handles.append(agent)
        self.running = handles
        if self.members is not None:
            self.members.warm()
        return handles

    def close(self) -> None:
        if self.members is not None:
            self.members.stop()
        for agent in self.agents:
            agent.abandon()
        for node in self.connected.values():
            node.close()
        self.agents, self.connected = [], {}
        if self.marker:
            self.config.layout.shared_marker(self.marker).unlink(missing_ok=True)
            self.marker = ""


class ElasticMembers:
    """An elastic job's membership (``--nodes MIN:MAX``; planning/elastic.py decides who).
    The launcher is the coordinator: every node beats to it and it beats to every node; when
    a node is lost (no heartbeat, connection gone, agent killed, ranks killed) the supervisor
    stops the survivors and ``regroup`` records the lost nodes in the ledger of bad nodes,
    starts agents on the survivors plus spares (the hostfile's other nodes, ledgered ones
    left out; a node that fails now is lost too) and plans the new world, whose MASTER_ADDR
    is its first node's."""

    def __init__(self, launcher: "SSHLauncher", pool: Sequence[Host], targets):
        self.launcher, self.pool, self.targets = launcher, list(pool), targets
        self.by_name = {h.name: h for h in pool}
        self.range = HostNodes.of(launcher.config).elastic
        self.lost: Dict[str, str] = {}          # host -> why, in this job
        self.standby: Dict[str, RemoteAgent] = {}   # started, probed, waiting for a plan
        self._beats: Optional[threading.Event] = None
        self._agents: Dict[int, RemoteAgent] = {}   # every agent started: each gets beats
        self.beat()                     # the agents watch for beats from their start

    def _excluded(self) -> Dict[str, object]:
        from fluidctl.cluster.ledger import excluded
        return excluded([h.name for h in self.pool])

    def _say(self, line: str) -> None:
        import sys
        self.launcher.log(line)
        print(f"fluidctl: {line}", file=sys.stderr, flush=True)

    def first_world(self) -> List[Host]:
        from fluidctl.planning.elastic import next_world
        barred = self._excluded()
        for host, entry in barred.items():
            self._say(f"node {host} left out: in the ledger of bad nodes ({entry.why}: "
                      f"{entry.detail})")
        names = next_world([], list(self.by_name), (), barred, self.range)
        if len(names) < self.range.low:
            raise UsageError(f"--nodes {self.range}: only {len(names)} of the "
                             f"{len(self.pool)} node(s) named are not in the ledger of bad "
                             "nodes", "'fluidctl cluster ledger list' says why; 'fluidctl "
                             "cluster ledger clear HOST' lets a node back in")
        return [self.by_name[n] for n in names]

    def _drop(self, host: str, why: str) -> None:
        from fluidctl.cluster.ledger import LOST, record
        self.lost[host] = why
        record(host, LOST, why, job=str(self.launcher.config.layout.root))
        standby = self.standby.pop(host, None)
        if standby is not None:
            standby.abandon()
        node = self.launcher.connected.pop(host, None)
        if node is not None:
            node.close()
        self._say(f"node {host} lost: {why} (recorded in the ledger of bad nodes)")

    def _start(self, hosts: Sequence[Host]):
        config, launcher = self.launcher.config, self.launcher
        found = start_agents(hosts, self.targets, backend=launcher.name,
                             python=config.interpreter, remote_dir=launcher.remote_dir,
                             timeout=config.ssh_timeout,
                             ports_wanted=launcher._ports_wanted(hosts),
                             launch_log=launcher.log, nodes=dict(launcher.connected),
                             venv=config.node_venv, beat=BEAT_EVERY, on_agent=self.track)
        launcher.connected.update(found[0])
        return found

    def warm(self) -> None:
        """Start standby agents, in the background, on every node that may be in the next
        world (the running ones and the spares): a restart then only hands out plans (an
        agent's start is a Python start-up on the node, a second or two). Each is probed now
        (its free ports too), beats like the others and ends when the launcher does."""
        from fluidctl.remote.ssh import parallel
        barred = self._excluded()
        hosts = [h for h in self.pool if h.name not in self.lost and h.name not in barred
                 and h.name not in self.standby]

        def one(host):
            _, agents, failures = self._start([host])
            if failures:
                return
            if self._beats.is_set():        # the job ended meanwhile
                agents[0].abandon()
            else:
                self.standby.setdefault(host.name, agents[0])
        if hosts:
            threading.Thread(target=parallel, args=(hosts, one), daemon=True,
                             name="standby-agents").start()

    def _usable(self, name: str) -> bool:
        agent = self.standby.get(name)
        if agent is None:
            return False
        if agent.probe is not None and not agent.channel.closed \
                and not agent.channel.exit_status_ready() and not agent._lost:
            return True
        self.standby.pop(name).abandon()
        return False

    def regroup(self, attempt: int) -> Plan:
        from fluidctl.errors import FluidctlError
        from fluidctl.planning.elastic import next_world
        launcher = self.launcher
        for agent in getattr(launcher, "running", []):
            why = agent.lost_reason()
            if why and agent.host not in self.lost:
                self._drop(agent.host, why)
        while True:
            names = next_world([h.name for h in launcher.hosts], list(self.by_name), self.lost,
                               self._excluded(), self.range)
            if len(names) < self.range.low:
                raise FluidctlError(
                    f"elastic job stopped: {len(names)} node(s) left, fewer than MIN "
                    f"{self.range.low} (lost: {', '.join(self.lost) or 'none'})",
                    "add nodes to the hostfile, or lower MIN", exit_code=1)
            hosts = [self.by_name[n] for n in names]
            # a node whose standby agent is not ready yet gets a fresh one now (waiting for
            # the standby could mean waiting out a spare that froze)
            fresh = [h for h in hosts if not self._usable(h.name)]
            if fresh:
                _, agents, failures = self._start(fresh)
                for name, why in failures:          # lost during the restart itself
                    self._drop(name, f"could not start its agent for restart {attempt}: {why}")
                if failures:
                    continue
                self.standby.update((h.name, a) for h, a in zip(fresh, agents))
            agents = [self.standby.pop(h.name) for h in hosts]
            break
        launcher.hosts, launcher.agents = hosts, agents
        plan = launcher._plan(hosts, agents, launcher._ports_wanted(hosts))
        self._say(f"restart {attempt}: new world of {len(plan.trainers)} trainer(s) on "
                  f"{', '.join(h.name for h in hosts)}, MASTER_ADDR {plan.master}")
        return plan

    def beat(self) -> None:
        """Start the launcher's heartbeats to the running agents (once)."""
        if self._beats is not None:
            return
        stop = self._beats = threading.Event()

        def beats():
            while not stop.wait(BEAT_EVERY):
                for key, agent in list(self._agents.items()):
                    if agent.channel.closed:
                        self._agents.pop(key, None)
                    else:
                        agent.beat()
        threading.Thread(target=beats, daemon=True, name="launcher-beats").start()

    def track(self, agent: RemoteAgent) -> None:
        """Beat to ``agent`` from its start on (it stops its node's work without beats)."""
        self._agents[id(agent)] = agent

    def stop(self) -> None:
        """Stop beating; let every standby agent go."""
        if self._beats is not None:
            self._beats.set()
        for agent in list(self.standby.values()):
            agent.abandon()
        self.standby.clear()


STACKS_TIMEOUT = 60.0       # how long the launcher waits for a node's stacks
SILENT = 5.0                # an agent quiet this long (it beats every 2 s) is cut off ...
SILENT_WAIT = 5.0           # ... once this long after the stacks were asked for
ENDS_WAIT = 5.0             # how long a failed job's report waits for the agents' last records


PROBE_TIMEOUT = 2.0         # a silent node's link probe: for the connection, then its banner


def _unanswered(dump: StackDump, agent, why: str, silent: float) -> None:
    """The ranks of a node whose stacks did not come: unreachable, or frozen when a probe of
    its link (after ``silent`` seconds without a word from it) says so."""
    state = "unreachable"
    if silent >= SILENT:
        link = probe_link(agent)
        if link.startswith("frozen: "):
            state, why = "frozen", (f"nothing came from its agent for {silent:.0f}s, "
                                    f"yet {link[len('frozen: '):]}")
        elif link:
            why = f"{why}; {link}"
    dump.notes.append(f"node {agent.host}: no stacks ({why})")
    for tag in agent.copies:
        if tag.startswith("trainer "):
            rank = int(tag.split()[1])
            dump.why[rank], dump.frames[rank] = why, None
            dump.state[rank] = state


def probe_link(agent) -> str:
    """Tell a frozen node from a cut one, for an agent that went silent: a new TCP connection
    to its node's SSH address and port (the agent's own connection may be closed by now). A
    cut link (or a dead node) does not accept it; a frozen node's kernel does (it completes
    the handshake for a listening socket whose process is stopped), but its sshd never sends
    its banner. Returns "frozen: <the
    evidence>" for a frozen node, the evidence for a cut one, "" where the probe cannot tell
    (a connection through a jump host or a proxy command)."""
    import socket
    target = getattr(agent.node, "target", None)
    if target is None or target.proxy_jump or target.proxy_command:
        return ""
    address, port = target.hostname, int(target.port)
    start = time.monotonic()
    try:
        sock = socket.create_connection((address, port), timeout=PROBE_TIMEOUT)
    except OSError as exc:
        said = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        return f"a new TCP connection to {address}:{port} failed ({said})"
    took = (time.monotonic() - start) * 1000
    try:
        sock.settimeout(PROBE_TIMEOUT)
        try:
            banner = sock.recv(64)
        except OSError:
            banner = b""
    finally:
        sock.close()
    accepted = f"a new TCP connection to {address}:{port} was accepted in {took:.0f} ms"
    if banner:
        return f"its link is up ({accepted}) and its sshd answers: its agent alone is silent"
    return (f"frozen: its link is up ({accepted}) and nothing answers on it (no SSH banner "
            f"within {PROBE_TIMEOUT:g}s): its processes are stopped (a frozen cgroup, a kernel "
            f"or hypervisor stall)")


class AgentDiagnostics(Diagnostics):
    """Diagnostics of ranks that run under node agents (``launcher.running``)."""

    def __init__(self, launcher: "SSHLauncher", **kw):
        super().__init__(**kw)
        self.launcher = launcher

    def agents(self) -> List[RemoteAgent]:
        return list(getattr(self.launcher, "running", []))

    def stacks(self, handles) -> StackDump:
        """Every node's ranks' stacks, asked of all agents at once. An agent that has not
        answered SILENT_WAIT seconds later and said nothing (not even its heartbeat) for
        SILENT seconds is cut off (its link or its node); the others get STACKS_TIMEOUT. The
        ranks of a node that did not answer are named unreachable (a partition)."""
        dump = StackDump()
        agents = [h for h in handles if h.poll() is None]
        # a node lost since the hang began (its connection timed out meanwhile) is named too:
        # left out, its ranks would be missing and the others' wait would look like "stuck"
        lost = [h for h in handles if h.poll() is not None and h.lost_reason()]
        asked = time.monotonic()
        for agent in agents:
            agent.ask_stacks()
        for agent in agents:
            record = agent.stacks(max(0.0, asked + SILENT_WAIT - time.monotonic()))
            silent = time.monotonic() - agent.heard
            if record is None and silent < SILENT:      # alive (it beats), only slow
                record = agent.stacks(max(0.0, asked + STACKS_TIMEOUT - time.monotonic()))
                silent = time.monotonic() - agent.heard
            if record is not None:
                dump.merge(StackDump.from_json(record))
                continue
            why = (f"its node ({agent.host}) did not answer: nothing came from it for "
                   f"{silent:.0f}s" if silent >= SILENT else
                   f"its node ({agent.host}) did not answer within {STACKS_TIMEOUT:g}s")
            _unanswered(dump, agent, why, silent)
        for agent in lost:
            _unanswered(dump, agent, f"its node ({agent.host}) is lost: {agent.lost_reason()}",
                        time.monotonic() - agent.heard)
        return dump

    def hosts(self, handles) -> Dict[int, str]:
        return {int(tag.split()[1]): agent.host for agent in handles
                for tag in agent.copies if tag.startswith("trainer ")}

    def step_samples(self) -> dict:
        """Every rank's straggler sums, from the agents' ``steps`` lines."""
        return {r: s for agent in self.agents() for r, s in agent.steps.items()}

    def activity(self, logs, handles=None):
        """Log sizes and the agents' counters (the ranks are on the nodes: no samples)."""
        sizes = local_activity(logs, self.diag)
        return lambda: (sizes(), tuple(a.progress for a in self.agents()))

    def ends(self, result) -> List[ProcessEnd]:
        """Every rank's final state as its agent reported it (the agent's last record, which
        may still be on its way when the agent's exit is seen); a node whose agent sent none
        (killed, connection lost) is one line."""
        if getattr(self, "_ends_of", (None,))[0] is result:
            return self._ends_of[1]
        by_node = {e.label: e for e in result.ends}
        out = []
        deadline = time.monotonic() + ENDS_WAIT
        for agent in self.agents():
            agent.ends_came.wait(max(0.0, deadline - time.monotonic()))
            if agent.ends:
                out += [ProcessEnd(e.label, agent.host, e.pid, e.state, e.returncode)
                        for e in agent.ends]
            elif agent.label in by_node:
                out.append(by_node[agent.label])
        self._ends_of = (result, out)
        return out


class FabricLauncher(SSHLauncher):
    """``--backend fabric``: the same agents, each node reached through Fabric's Connection."""
    name = "fabric"
