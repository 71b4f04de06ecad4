"""An elastic job's membership over SSH (``--nodes MIN:MAX``): heartbeats both ways, lost
nodes in the ledger, standby agents on spares, the next world planned
(``fluidctl.planning.elastic`` decides who)."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

from fluidctl import telemetry
from fluidctl.errors import UsageError
from fluidctl.planning.elastic import HostNodes
from fluidctl.planning.hosts import Host
from fluidctl.planning.plan import Plan
from fluidctl.backends.ssh.agent import RemoteAgent, start_agents


REJOIN_EVERY = 2.0          # how often an elastic job below MAX tries its lost nodes again


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
        self.may_rejoin: set = set()            # lost ones that may come back (``_drop``)
        self.standby: Dict[str, RemoteAgent] = {}   # started, probed, waiting for a plan
        self._beats: Optional[threading.Event] = None
        self._agents: Dict[int, RemoteAgent] = {}   # every agent started: each gets beats
        self.beat()                     # the agents watch for beats from their start

    def _excluded(self) -> Dict[str, object]:
        from fluidctl.cluster.ledger import excluded
        return excluded(self.pool)      # by each node's address, not its alias

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

    def _drop(self, host: str, why: str, silent: bool = True) -> None:
        """``silent``: lost to silence (no heartbeat, no connection, no agent start), which a
        frozen or cut-off node recovers from; such a node may rejoin (``_rejoin``), a node
        whose agent was killed does not."""
        from fluidctl.cluster.ledger import LOST, record
        self.lost[host] = why
        if silent:
            self.may_rejoin.add(host)
        record(self.by_name.get(host, host), LOST, why,
               job=str(self.launcher.config.layout.root))
        standby = self.standby.pop(host, None)
        if standby is not None:
            standby.abandon()
        node = self.launcher.connected.pop(host, None)
        if node is not None:
            node.close()
        telemetry.emit(telemetry.NodeLost(host=host, why=why), otherwise=self._say)

    def _drop_lost(self) -> None:
        """Drop (and ledger) every running node that counts as lost: at a restart, and at the
        job's end (a node lost on the last allowed attempt is ledgered too)."""
        for agent in getattr(self.launcher, "running", []):
            why = agent.lost_reason()
            if why and agent.host not in self.lost:
                self._drop(agent.host, why, silent=bool(agent._lost))

    def _start(self, hosts: Sequence[Host]):
        config, launcher = self.launcher.config, self.launcher
        found = start_agents(hosts, self.targets, backend=launcher.name,
                             python=config.interpreter, remote_dir=launcher.remote_dir,
                             timeout=config.ssh_timeout,
                             ports_wanted=launcher._ports_wanted(hosts),
                             launch_log=launcher.log, nodes=dict(launcher.connected),
                             venv=config.node_venv, beat=launcher.beat, on_agent=self.track)
        launcher.connected.update(found[0])
        return found

    def warm(self) -> None:
        """Start standby agents, in the background, on every node that may be in the next
        world (the running ones and the spares): a restart then only hands out plans (an
        agent's start is a Python start-up on the node, a second or two). Each is probed now
        (its free ports too), beats like the others and ends when the launcher does."""
        import time
        from fluidctl.remote.ssh import parallel
        barred = self._excluded()
        hosts = [h for h in self.pool if h.name not in self.lost and h.name not in barred
                 and h.name not in self.standby]
        began = time.monotonic()

        def one(host):
            _, agents, failures = self._start([host])
            if failures:
                return
            if self._beats.is_set():        # the job ended meanwhile
                agents[0].abandon()
            else:
                self.standby.setdefault(host.name, agents[0])

        def all_of_them():
            parallel(hosts, one)
            ready = sum(h.name in self.standby for h in hosts)
            self.launcher.log(f"standby agents ready on {ready} of {len(hosts)} node(s) in "
                              f"{time.monotonic() - began:.1f}s: a restart hands them plans")
        if hosts:
            threading.Thread(target=all_of_them, daemon=True, name="standby-agents").start()

    def _usable(self, name: str) -> bool:
        agent = self.standby.get(name)
        if agent is None:
            return False
        # a standby agent that missed the launcher's beats (the launcher was stopped) is
        # stopping itself: a fresh one instead
        if agent.probe is not None and not agent.channel.closed \
                and not agent.channel.exit_status_ready() and not agent._lost \
                and not agent.launcher_stopped:
            return True
        self.standby.pop(name).abandon()
        return False

    def regroup(self, attempt: int) -> Plan:
        from fluidctl.errors import FluidctlError
        from fluidctl.planning.elastic import next_world
        launcher = self.launcher
        self._drop_lost()
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
        telemetry.emit(telemetry.World(attempt=attempt, trainers=len(plan.trainers),
                                       hosts=tuple(h.name for h in hosts), master=plan.master),
                       otherwise=self._say)
        return plan

    def _rejoin(self, stop: threading.Event) -> None:
        """While the world is below MAX, try the nodes lost to silence in this job every
        REJOIN_EVERY seconds: one whose sshd answers again gets an agent, whose probe (the node's report)
        is its health check; passed, it leaves the lost and the ledger and the supervisor
        starts a new world with it."""
        said: Dict[str, str] = {}           # host -> the last reason logged for it
        while not stop.wait(REJOIN_EVERY):
            try:
                self._try_rejoin(stop, said)
            except Exception as exc:        # the watch goes on: a lost node may come back
                self.launcher.log(f"rejoin watch: {type(exc).__name__}: {exc}")

    def _try_rejoin(self, stop: threading.Event, said: Dict[str, str]) -> None:
        """One round of ``_rejoin``; why a node that answers again could not rejoin goes to
        launch.log (once per reason)."""
        from fluidctl.cluster import ledger
        from fluidctl.errors import FluidctlError
        supervisor = getattr(self.launcher, "supervisor", None)
        if supervisor is None or len(self.launcher.hosts) >= self.range.high:
            return
        from fluidctl.backends.ssh.diagnostics import probe_target
        for name in [n for n in self.lost if n in self.may_rejoin]:
            target = self.targets.get(name)
            if target is None or not probe_target(target).startswith("its link is up"):
                continue            # still frozen, cut or down (or behind a proxy)
            _, agents, failures = self._start([self.by_name[name]])
            if failures or stop.is_set():
                for agent in agents:        # None where a node failed to start one
                    if agent is not None:
                        agent.abandon()
                why = "; ".join(f"{h}: {w}" for h, w in failures) or "the job is ending"
                if said.get(name) != why:
                    said[name] = why
                    self.launcher.log(f"node {name} answers again but cannot rejoin yet: {why}")
                continue
            self.standby[name] = agents[0]
            del self.lost[name]
            self.may_rejoin.discard(name)
            try:
                ledger.clear(ledger.identity(self.by_name[name]))
            except FluidctlError:
                pass                # a damaged ledger: its warning was said
            self._say(f"node {name} answers again and passed its probe: it rejoins in a "
                      "new world (its ledger entry is lifted)")
            supervisor.regroup(f"node {name} rejoined")
            return

    def beat(self) -> None:
        """Start the launcher's heartbeats to the running agents (once), and the watch for
        lost nodes that come back (``_rejoin``)."""
        if self._beats is not None:
            return
        stop = self._beats = threading.Event()
        threading.Thread(target=self._rejoin, args=(stop,), daemon=True,
                         name="rejoin-lost-nodes").start()

        def beats():
            while not stop.wait(self.launcher.beat):
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
        """Ledger the nodes lost on the last attempt; stop beating; let every standby agent
        go."""
        self._drop_lost()
        if self._beats is not None:
            self._beats.set()
        for agent in list(self.standby.values()):
            agent.abandon()
        self.standby.clear()
