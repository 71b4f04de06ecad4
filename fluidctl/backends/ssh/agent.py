"""The launcher's handle on one node agent over SSH (``RemoteAgent``: its probe, its share of
the plan, the tagged lines it streams back, heartbeats, signals and how it ended), and bringing
every node's agent up in parallel (``bring_up``, ``start_agents``). The node side is
``fluidctl.node.agent``; the conversation is ``fluidctl/agentproto.py``."""
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
from fluidctl.agentproto import (AGENT_MODULE, BEAT_COMMAND, BEAT_MISSES, BEAT_TAG,
                                 CHECKPOINT_COMMAND, CR_MARK, DOCTOR_TAG, DUMP_COMMAND, ENDS_TAG,
                                 FAILURE_TAG, PROBE_TAG, SAY_TAG, STACKS_TAG, STEPS_TAG,
                                 STOP_COMMAND, USAGE_TAG, WATCH_EVERY, Ends, NodeShare, ProcessEnd, Probe,
                                 RecordError, parse_line, tag_for)
from fluidctl.errors import UsageError, node_failures
from fluidctl.diagnostics.failures import Failure, FailureKind
from fluidctl.planning.hosts import Host
from fluidctl.planning.plan import Plan, ProcSpec


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
        self.launcher_stopped = 0.0             # seconds the launcher was seen stopped
        self._lost_probe: Optional[str] = None  # probe_link's answer once the node is lost
        self.progress = 0                       # collectives completed on the node (beats)
        self.steps: dict = {}                   # the node's ranks' straggler sums (steps)
        self.usage: dict = {}                   # rank -> its CPU%, RSS (GPU) on the node
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
        self._woke = time.monotonic()
        from fluidctl.remote.pump import pump
        pump().every_tick(self._watch_end)      # one thread watches every node's agent

    def _watch_end(self, now: float) -> bool:
        """One check, every tick of the channel pump, until the agent ends (then False).
        Owns the pipe's write end (so it is never written after being closed). In an elastic
        job it also watches the agent's heartbeats (``beat_timeout``). A gap in the pump's own
        clock longer than half of that means the launcher itself was stopped (Ctrl-Z, a
        paused VM, a swapping login node): every node was silent to it at once, and none of
        them is blamed; each gets a fresh ``beat_timeout`` to be heard again."""
        try:
            transport = self.channel.get_transport()
            ended = (self.channel.status_event.is_set() or self.channel.closed
                     or transport is None or not transport.is_active())
        except Exception:                   # a broken channel: the agent is gone
            ended = True
        stopped, self._woke = now - self._woke, now
        if self.beat_timeout and stopped > self.beat_timeout / 2:
            # said whether or not the agent has ended meanwhile: after SIGCONT, the agent's
            # end (it stopped itself, missing our beats) may be read before this tick runs
            self.heard = max(self.heard, now)
            self.launcher_stopped = stopped         # its agent missed our beats: it stops
            self.launch_log(f"the launcher itself was stopped for {stopped:.1f}s (a gap in "
                            f"its own clock): node {self.host}'s silence meanwhile is not "
                            "counted against it")
            if not ended:
                return True
        if not ended:
            silent = now - self.heard
            if not (self.beat_timeout and silent > self.beat_timeout):
                return True
            self.declare_lost(f"no heartbeat from its agent for {silent:.1f}s")
        try:
            os.write(self._ended_w, b"x")
        except OSError:                     # the read end is gone: nobody is waiting
            pass
        os.close(self._ended_w)
        return False

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
        is gone, or its agent was killed before it could report. How its ranks ended (an exit
        code, SIGKILL from a user or the job's own OOM) is the job's, never the node's."""
        code = self.poll()
        if self._lost:
            return self._lost
        if code is None or code == 0:
            return ""
        if self._record is None:
            return "its agent was killed" if code in _KILLED else ""
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
        """The node's rendezvous problems (backends/ssh/doctor.py), None without an answer."""
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

    def send_request(self, kind: str) -> None:
        """A checkpoint request that stops nothing (``save``): the agent writes it into its
        node's request file and signals no one; the ranks read the file."""
        from fluidctl.remote.ssh import NODE_LOST
        try:
            self.channel.sendall(f"{CHECKPOINT_COMMAND} {kind}\n".encode())
        except NODE_LOST:
            pass            # a lost node is the supervisor's to report

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
        elif tag == USAGE_TAG:
            self.usage = {int(r): dict(u) for r, u in json.loads(text).items()}
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
            from fluidctl.backends.ssh.diagnostics import probe_link
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


# an agent's end that means it was killed from outside (-9 as sshd
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


def _usable(node) -> bool:
    """A connection that can still open a session: not closed (a lost node's is, by
    ``declare_lost`` or the elastic supervisor), its transport up."""
    client = getattr(node, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and transport.is_active()


def start_agents(hosts: Sequence[Host], targets, *, backend: str, python: str,
                 remote_dir: str, timeout: float, ports_wanted: Dict[str, int], launch_log,
                 nodes: Optional[Dict[str, object]] = None, venv: Optional[str] = None,
                 beat: float = 0.0, on_agent=None):
    """``bring_up`` without the error: ({name: node}, [agent per host], [(name, why)]); when
    any node failed, every agent was told to exit and the connections this call made (not
    ``nodes``') are closed. ``on_agent(agent)``: called as each agent starts (the launcher
    beats to it from then on)."""
    from fluidctl.remote import preconnect
    from fluidctl.remote.ssh import ConnectFailed, parallel
    cls = node_class(backend)
    given = nodes or {}

    def one(host: Host):
        where = node_dir(remote_dir, host.name)
        node = given.get(host.name)
        if node is not None and not _usable(node):     # closed since (its node was lost)
            node = None
        if node is None:
            try:
                # connected while the options were checked, where it could be
                node = preconnect.take(host.name, targets[host.name], cls)
                if node is None:
                    node = cls(host, targets[host.name], timeout=timeout,
                               timeout_option="--ssh-timeout")
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
            if given.get(name) is not node:     # made here
                node.close()
        connected = {name: node for name, node in connected.items() if given.get(name) is node}
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
