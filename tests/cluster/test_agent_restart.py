"""An agent started again on a node whose earlier connection the launcher closed (it was lost,
then answers again: elastic jobs' rejoin), on the real loopback sshd nodes: the closed
connection handed in is not reused. It was: every try said "could not start fluidctl there:
'NoneType' object has no attribute 'get_transport'" and the node never rejoined."""
import sys

from fluidctl.backends.ssh.agent import RemoteAgent, start_agents
from fluidctl.planning.hosts import Host
from fluidctl.remote.ssh import SSHNode
from fluidctl.remote.sshconfig import resolve_hosts


def test_an_agent_starts_on_a_node_whose_earlier_connection_was_closed(sshd_nodes, tmp_path):
    hosts, targets = resolve_hosts([Host("node1")], sshd_nodes.config)
    closed = SSHNode(hosts[0], targets["node1"], timeout=20)
    closed.connect()
    closed.close()                      # as declare_lost and the elastic supervisor leave it
    logged = []
    connected, agents, failures = start_agents(
        hosts, targets, backend="ssh", python=sys.executable, remote_dir=str(tmp_path),
        timeout=30, ports_wanted={}, launch_log=logged.append, nodes={"node1": closed})
    try:
        assert failures == [], (failures, logged)
        assert isinstance(agents[0], RemoteAgent) and agents[0].probe is not None
        assert connected["node1"] is not closed and connected["node1"].client is not None
    finally:
        for agent in agents:
            if agent is not None:
                agent.abandon()
        for node in connected.values():
            node.close()
