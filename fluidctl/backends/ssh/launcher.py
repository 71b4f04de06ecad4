"""The ``ssh`` backend's launcher (``SSHLauncher``; ``fabric.py``'s ``FabricLauncher`` is the
same over Fabric): one node agent per node (its handle: ``agent.py``; the node side:
``fluidctl.node.agent``), an elastic job's membership in ``elastic.py``, the agents' diagnostics
in ``diagnostics.py``.

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

import os
from typing import Dict, List, Optional, Sequence

from fluidctl import envs
from fluidctl.agentproto import BEAT_MISSES
from fluidctl.backends.base import BaseLauncher
from fluidctl.errors import UsageError
from fluidctl.planning import plan as planner
from fluidctl.planning.elastic import HostNodes
from fluidctl.planning.hosts import Host
from fluidctl.planning.plan import LaunchCommand, Plan
from fluidctl.backends.ssh.agent import (RemoteAgent, agent_argv, bring_up, make_shared_marker,
                                       node_dir, node_share)
from fluidctl.backends.ssh.elastic import ElasticMembers


# What a launch needs once its nodes have answered (the supervisor, the diagnostics, the
# rendezvous check, the live view: 15-20 ms of imports), loaded while they are connected to.
PRELOAD = ("fluidctl.launch.run", "fluidctl.backends.ssh.diagnostics",
           "fluidctl.backends.ssh.doctor", "fluidctl.launch.relay", "fluidctl.launch.requests",
           "fluidctl.observe.watching", "fluidctl.diagnostics.stragglerwatch",
           "fluidctl.diagnostics.checkpoints", "fluidctl.telemetry.steptimes")


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
        self.running: List[RemoteAgent] = []     # the agents of the running attempt
        self.config = None
        self.marker = ""            # the nonce of our shared marker in LOG_DIR, once made
        self.members = None         # an elastic job's membership (ElasticMembers)
        self.plan: Optional[Plan] = None    # the running world's plan (an elastic restart
                                            # makes a new one)

    @property
    def starts_first(self) -> bool:
        """An elastic job's start emits its world's events: the supervisor is set up first."""
        return self.members is None

    @property
    def beat(self) -> float:
        """Seconds between the launcher's and the agents' heartbeats (0: not elastic): a
        BEAT_MISSES-th of FLUIDCTL_HEARTBEAT_TIMEOUT, which both ends wait before the other
        is gone."""
        if self.members is None:
            return 0.0
        return envs.knob(envs.HEARTBEAT_TIMEOUT) / BEAT_MISSES

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
        from fluidctl.preload import Preload
        from fluidctl.remote import preconnect
        preload = Preload(PRELOAD)      # while the nodes are connected to and probed
        try:
            self.connected, self.agents = bring_up(
                self.hosts, targets, backend=self.name, python=config.interpreter,
                remote_dir=self.remote_dir, timeout=config.ssh_timeout, ports_wanted=wanted,
                launch_log=self.log, venv=config.node_venv, beat=self.beat,
                on_agent=self.members.track if self.members is not None else None)
        finally:
            preload.join()
            preconnect.close()          # the early connections bring_up did not take
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
        either (backends/ssh/doctor.py)."""
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
        from fluidctl.backends.ssh import doctor
        problems = doctor.examine(plan, self.hosts, self.agents, self.config.ssh_timeout)
        if problems:
            import click            # only to print: its import is on every launch's path
            for line in problems:
                click.echo(f"error: {line}", err=True)
            raise UsageError(f"the rendezvous check found {len(problems)} problem(s)",
                             "fix the lines above; nothing was started")

    def diagnostics(self, config):
        """Ranks run under the node agents: their stacks come from a "dump" line to each
        agent, their progress from the agents' heartbeats."""
        from fluidctl.backends.ssh.diagnostics import AgentDiagnostics
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
        from fluidctl.remote.ssh import NODE_LOST
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
            try:
                agent.send_plan(share, procs)
            except NODE_LOST as exc:    # lost since it was chosen: the supervisor sees it so
                agent.declare_lost(f"its connection closed before it got its plan ({exc})")
            handles.append(agent)
        self.running = handles
        # standby agents for the next world; none once the restarts are spent (a lost node
        # that rejoins still gets agents started for it then, a second or two)
        if self.members is not None and attempt < config.max_restarts:
            self.members.warm()
        return handles

    def relay_checkpoint(self, kind: str) -> None:
        """A ``save`` request to every running node agent: it writes its node's request
        file, which its ranks read."""
        for agent in list(self.running):
            agent.send_request(kind)

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
