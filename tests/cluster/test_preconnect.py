"""An SSH launch connects to its nodes while the rest of its options are checked
(fluidctl/remote/preconnect.py): the nodes' own start (sshd's session, the login shell, the
agent) no longer waits for the planner and the launcher's modules."""
import dataclasses
import subprocess
import sys
import time

import pytest

from fluidctl.remote import preconnect
from fluidctl.remote.fabric import FabricNode
from fluidctl.remote.ssh import ConnectFailed, SSHNode
from fluidctl.remote.sshconfig import resolve_hosts
from fluidctl.planning.hosts import parse_hostfile
from launchutil import BEHAVE, fluidctl

# `fluidctl train` whose option check waits (up to 20 s) for any node's connection, and says
# whether one came: the old order connected only after the options were checked
WAITING = """
import sys, threading
from fluidctl.remote import fabric, ssh
from fluidctl.planning import config

connected = threading.Event()


def recording(connect):
    def recording_connect(self):
        node = connect(self)
        connected.set()
        return node
    return recording_connect


from_options = config.LaunchConfig.from_options.__func__
seen = []


def waiting_from_options(cls, *args, **kwargs):
    seen.append(connected.wait(20))
    return from_options(cls, *args, **kwargs)


ssh.SSHNode.connect = recording(ssh.SSHNode.connect)
fabric.FabricNode.connect = recording(fabric.FabricNode.connect)
config.LaunchConfig.from_options = classmethod(waiting_from_options)
import atexit
atexit.register(lambda: print("connected while the options were checked:", seen, flush=True))
from fluidctl.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("backend", ["ssh", "fabric"])
def test_the_nodes_are_connected_to_while_the_options_are_checked(tmp_path, sshd_nodes,
                                                                  backend):
    hosts = sshd_nodes.hostfile("hosts.2x1", slots=1)
    done = subprocess.run([sys.executable, "-c", WAITING, "train", "--hostfile", str(hosts),
                           "--backend", backend, "--ssh-config", str(sshd_nodes.config),
                           "--tee", "all",
                           str(BEHAVE)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "connected while the options were checked: [True]" in done.stdout
    assert "rank 0 ready" in done.stdout and "rank 1 ready" in done.stdout    # the job ran


def test_a_refused_option_closes_the_early_connections_and_starts_nothing(tmp_path,
                                                                          sshd_nodes):
    hosts = sshd_nodes.hostfile("hosts.2x1", slots=1)
    started = time.monotonic()
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                   "--env-file", tmp_path / "missing.env", BEHAVE, cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "missing.env" in res.stderr
    assert not (tmp_path / "mylog").exists()
    assert time.monotonic() - started < 10          # no wait on a connection's time-out


def _early(sshd_nodes, tmp_path):
    hosts = sshd_nodes.hostfile("hosts.2x1", slots=1)
    preconnect.start({"hostfile": str(hosts), "ssh_config": str(sshd_nodes.config),
                      "ssh_timeout": 10.0, "backend": "ssh"})
    resolved, targets = resolve_hosts(parse_hostfile(hosts), str(sshd_nodes.config))
    return targets


def test_a_taken_connection_runs_commands_and_the_rest_are_closed(tmp_path, sshd_nodes):
    targets = _early(sshd_nodes, tmp_path)
    try:
        node1 = preconnect.take("node1", targets["node1"], SSHNode)
        assert node1.run("echo early").stdout.strip() == "early"
        assert preconnect.take("node1", targets["node1"], SSHNode) is None       # taken once
        node2 = preconnect._current._threads["node2"]
        node2.join(30)
        transport = preconnect._current._found["node2"][1].client.get_transport()
        assert transport.is_active()
    finally:
        preconnect.close()
    assert not transport.is_active()            # node2 was never taken: closed
    assert node1.run("echo still").stdout.strip() == "still"    # the taken one stays
    node1.close()


def test_a_connection_made_to_another_target_is_not_taken(tmp_path, sshd_nodes):
    targets = _early(sshd_nodes, tmp_path)
    try:
        moved = dataclasses.replace(targets["node2"], port=targets["node2"].port + 1)
        assert preconnect.take("node2", moved, SSHNode) is None
    finally:
        preconnect.close()


def test_a_connection_made_for_another_backend_is_not_taken(tmp_path, sshd_nodes):
    hosts = sshd_nodes.hostfile("hosts.2x1", slots=1)
    preconnect.start({"hostfile": str(hosts), "ssh_config": str(sshd_nodes.config),
                      "ssh_timeout": 10.0, "backend": "fabric"})
    try:
        _, targets = resolve_hosts(parse_hostfile(hosts), str(sshd_nodes.config))
        assert preconnect.take("node1", targets["node1"], SSHNode) is None
        node2 = preconnect.take("node2", targets["node2"], FabricNode)
        assert node2.run("echo fabric").stdout.strip() == "fabric"
        node2.close()
    finally:
        preconnect.close()


def test_an_early_connection_that_failed_says_why_once_taken(tmp_path, sshd_nodes):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.4:1 slots=1\n")            # nothing listens there
    preconnect.start({"hostfile": str(hostfile), "ssh_config": str(sshd_nodes.config),
                      "ssh_timeout": 3.0, "backend": "ssh"})
    try:
        _, targets = resolve_hosts(parse_hostfile(hostfile), str(sshd_nodes.config))
        try:
            preconnect.take("127.0.0.4", targets["127.0.0.4"], SSHNode)
        except ConnectFailed as exc:
            assert "127.0.0.4" in str(exc) or "refused" in str(exc).lower()
        else:
            raise AssertionError("a refused connection was taken")
    finally:
        preconnect.close()


def test_no_more_nodes_are_connected_early_than_bring_up_starts_at_once(tmp_path, sshd_nodes):
    """A thousand-node hostfile does not open a thousand handshakes at once: the first wave."""
    from fluidctl.remote.ssh import PARALLEL
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"127.0.1.{i}:1 slots=1\n" for i in range(1, PARALLEL + 9)))
    preconnect.start({"hostfile": str(hostfile), "ssh_config": str(sshd_nodes.config),
                      "ssh_timeout": 3.0, "backend": "ssh"})
    try:
        assert len(preconnect._current._threads) == PARALLEL
        assert "127.0.1.1" in preconnect._current._threads
        assert f"127.0.1.{PARALLEL + 8}" not in preconnect._current._threads
    finally:
        preconnect.close()
