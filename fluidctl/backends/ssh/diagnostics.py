"""Diagnostics of ranks that run under node agents (``AgentDiagnostics``: stacks, activity,
straggler samples and ends from the agents' records) and ``probe_link``, which tells a frozen
node from a cut one once its agent went silent."""
from __future__ import annotations

import time
from typing import Dict, List

from fluidctl.agentproto import ProcessEnd
from fluidctl.diagnostics.watch import Diagnostics, StackDump, local_activity


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
    return probe_target(getattr(agent.node, "target", None))


def probe_target(target) -> str:
    """``probe_link`` of an SSH target (ssh config's host, port, proxies)."""
    import socket
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

    def supervised_by(self, supervisor) -> None:
        self.launcher.supervisor = supervisor   # an elastic job's rejoining node regroups

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

    def usage(self) -> dict:
        """Every rank's CPU%, RSS (GPU), from the agents' ``usage`` lines."""
        return {r: u for agent in self.agents() for r, u in agent.usage.items()}

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
