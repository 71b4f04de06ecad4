"""The paramiko backend against two real sshd nodes on 127.0.0.2 and 127.0.0.3."""
import os
import re
import socket
import sys
import threading
import time

import psutil
import pytest

from fluidctl.remote import fabric, ssh, sftp as sync
from fluidctl.remote.sshconfig import QuickAckSocket
from fluidctl.cluster import check as nodecheck
from fluidctl.planning.hosts import Host, parse_hostfile
from fluidctl.remote.sshconfig import resolve, resolve_hosts, load_config

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def cluster(sshd_nodes):
    hosts, targets = resolve_hosts(parse_hostfile(sshd_nodes.hostfile()), sshd_nodes.config)
    return hosts, targets


@pytest.fixture(params=["paramiko", "fabric"])
def node1(cluster, request):
    """node1 through each backend: both must behave the same."""
    hosts, targets = cluster
    node_class = ssh.SSHNode if request.param == "paramiko" else fabric.FabricNode
    node = node_class(hosts[0], targets["node1"], timeout=TIMEOUT).connect()
    yield node
    node.close()


def test_run_streams_lines_with_env_cwd_and_exit_code(node1, tmp_path):
    seen = []
    script = "import os, sys; print(os.getcwd()); print('é' * 3, file=sys.stderr); " \
             "print(os.environ['GREETING']); sys.exit(7)"
    result = node1.run([sys.executable, "-c", script], env={"GREETING": "it's 'quoted' $HOME"},
                       cwd=str(tmp_path), on_line=lambda stream, line: seen.append((stream, line)))
    assert result.exit_code == 7
    assert result.stdout.splitlines() == [str(tmp_path), "it's 'quoted' $HOME"]
    assert ("stderr", "ééé") in seen and ("stdout", "it's 'quoted' $HOME") in seen
    assert node1.peer_address == "127.0.0.2"
    assert node1.run("exit 0").exit_code == 0


def test_the_connection_sends_small_requests_at_once(node1):
    """TCP_NODELAY on the node's socket, as OpenSSH's client sets it: with Nagle's algorithm on
    (paramiko's default) every small request waits for the server's delayed ACK, 40 ms each.
    And what the server sends is acknowledged at once (sshd keeps Nagle on: its session
    confirmation otherwise waits 40 ms for our ACK of its host-keys message)."""
    sock = node1.client.get_transport().sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert isinstance(sock, QuickAckSocket)
    assert node1.run("exit 0").exit_code == 0


def test_a_node_session_keeps_fluidctl_state_out_of_the_home(node1, sshd_nodes):
    """What fluidctl started on a test node keeps (pserver pid files, ledgers) goes under the
    test's directory: the node's sshd sets FLUIDCTL_STATE_DIR, as no test may touch ~/.fluidctl."""
    out = node1.run('printf %s "$FLUIDCTL_STATE_DIR"').stdout
    assert out.startswith(str(sshd_nodes.workdir)) and ".fluidctl" not in out


def running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_signal_stops_the_remote_process_group(node1):
    proc = node1.start("sleep 60 & sleep 60; wait")
    pid = proc.wait_pid(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT       # this machine is the node: look at its pids
    while len(psutil.Process(pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    children = psutil.Process(pid).children()
    assert len(children) == 2
    assert proc.send_signal()
    assert proc.wait(TIMEOUT) == -15
    while any(running(c) for c in children) and time.monotonic() < deadline + TIMEOUT:
        time.sleep(0.01)
    assert not [c for c in children if running(c)]


def test_lost_connection_is_detected(sshd_nodes, node1):
    proc = node1.start(["sleep", "60"])
    pid = proc.wait_pid(TIMEOUT)
    client_port = node1.client.get_transport().sock.getsockname()[1]
    session = sshd_nodes.session_pids("node1", client_port)
    assert session
    for server_pid in session:
        psutil.Process(server_pid).kill()
    with pytest.raises(ssh.ConnectionLost, match="connection to node1 .* was lost"):
        proc.wait(TIMEOUT * 2)
    try:  # the orphaned sleep on the "remote" node: started by this test, ended by pid
        psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
        pass


def config_with_known_hosts(sshd_nodes, tmp_path, alias, node, known):
    """An ssh config naming ``node`` as ``alias``, with its own known_hosts file."""
    cfg = tmp_path / f"ssh_config.{alias}"
    cfg.write_text(f"Host {alias}\n  HostName {sshd_nodes.nodes[node].address}\n"
                   f"  Port {sshd_nodes.nodes[node].port}\n  User root\n"
                   f"  IdentityFile {sshd_nodes.user_key}\n  UserKnownHostsFile {known}\n")
    return load_config(cfg)


def poll_until_done(proc, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError("still running")


@pytest.mark.parametrize("how", ["wait", "poll"])
def test_silent_peer_is_detected_by_keepalive(sshd_nodes, cluster, how):
    """The server stops answering without closing TCP (a frozen or cut-off node): the keepalive
    ping notices and the command reports a lost connection."""
    hosts, targets = cluster
    node = ssh.SSHNode(hosts[1], targets["node2"], timeout=TIMEOUT, keepalive=0.5).connect()
    proc = node.start(["sleep", "60"])
    pid = proc.wait_pid(TIMEOUT)
    client_port = node.client.get_transport().sock.getsockname()[1]
    frozen = [psutil.Process(p) for p in sshd_nodes.session_pids("node2", client_port)]
    assert frozen
    for server in frozen:
        server.suspend()
    try:
        with pytest.raises(ssh.ConnectionLost, match="node2"):
            proc.wait(TIMEOUT * 4) if how == "wait" else poll_until_done(proc, TIMEOUT * 4)
    finally:
        for server in frozen:
            try:
                server.resume()
                server.kill()
            except psutil.NoSuchProcess:    # sshd may already have reaped its frozen session
                pass
        node.close()
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_unknown_host_key_refused_by_default_and_accept_new_records_it(sshd_nodes, tmp_path):
    known = tmp_path / "known_hosts"
    port = sshd_nodes.nodes["node2"].port
    config = config_with_known_hosts(sshd_nodes, tmp_path, "fresh", "node2", known)
    host = Host("fresh")
    with pytest.raises(ssh.ConnectFailed, match=r"not in known_hosts.*--accept-new-host-keys"):
        ssh.SSHNode(host, resolve(host, config), timeout=TIMEOUT).connect()
    assert not known.exists()
    with ssh.SSHNode(host, resolve(host, config, accept_new=True), timeout=TIMEOUT) as node:
        assert node.run("echo ok").stdout == "ok"
    assert known.read_text().split() == [f"[127.0.0.3]:{port}", *sshd_nodes.host_key_pub.split()[:2]]
    with ssh.SSHNode(host, resolve(host, config), timeout=TIMEOUT) as node:   # now known
        assert node.run("echo again").stdout == "again"
    # a key that changed is refused even with accept_new
    known.write_text(f"[127.0.0.3]:{port} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    with pytest.raises(ssh.ConnectFailed, match="does not match known_hosts"):
        ssh.SSHNode(host, resolve(host, config, accept_new=True), timeout=TIMEOUT).connect()


def test_unreachable_and_silent_nodes_get_a_clear_reason(sshd_nodes):
    closed = socket.socket()
    closed.bind(("127.0.0.4", 0))
    closed_port = closed.getsockname()[1]
    closed.close()                        # nothing listens there now
    silent = socket.socket()              # accepts TCP, never speaks SSH
    silent.bind(("127.0.0.5", 0))
    silent.listen()
    accepted = []
    stop = threading.Event()

    def accept():
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except socket.timeout:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        hosts = [Host("node1"), Host("127.0.0.4", port=closed_port),
                 Host("127.0.0.5", port=silent.getsockname()[1])]
        started = time.monotonic()
        checks = nodecheck.check_nodes(hosts, sshd_nodes.config, timeout=2.0)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        silent.close()
    by_host = {c.host: c for c in checks}
    assert by_host["node1"].ok, by_host["node1"].reason
    assert not by_host["127.0.0.4"].ok
    assert f"connection refused at 127.0.0.4:{closed_port}" in by_host["127.0.0.4"].reason
    assert not by_host["127.0.0.5"].ok
    assert "no SSH handshake with 127.0.0.5" in by_host["127.0.0.5"].reason
    assert "within 2s" in by_host["127.0.0.5"].reason
    assert elapsed < 30          # bounded by the timeout, not by TCP's minutes-long retries


def test_check_nodes_reports_versions_and_a_missing_python(cluster):
    hosts, targets = cluster
    good = nodecheck.check_nodes(hosts, targets=targets, timeout=TIMEOUT)
    assert [c.host for c in good] == ["node1", "node2"]
    assert all(c.ok and c.python == sys.version.split()[0] and c.disk_free > 0 and c.gpus == 0
               for c in good)
    # what a GPU rank would get there; the test extra installs the real CuPy and NCCL
    assert all(re.fullmatch(r"CuPy 1\d\.\d+\.\d+, NCCL 2\.\d+\.\d+, no usable GPU( \(\w+\))?",
                            c.gpu_stack) for c in good), [c.gpu_stack for c in good]
    bad = nodecheck.check_nodes(hosts, targets=targets, timeout=TIMEOUT,
                                python="/nonexistent/python3")
    assert all(not c.ok and "python /nonexistent/python3 not found" in c.reason for c in bad)
    gone = nodecheck.check_nodes(hosts[:1], targets=targets, timeout=TIMEOUT,
                                 remote_dir="/nonexistent/d")
    assert "remote dir /nonexistent/d does not exist" in gone[0].reason


@pytest.mark.parametrize("node_class", [ssh.SSHNode, fabric.FabricNode])
def test_proxy_jump_through_node1(sshd_nodes, tmp_path, node_class):
    n2 = sshd_nodes.nodes["node2"]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd_nodes.config.read_text() +
                   f"Host behind\n  HostName 127.0.0.3\n  Port {n2.port}\n  User root\n"
                   f"  IdentityFile {sshd_nodes.user_key}\n"
                   f"  UserKnownHostsFile {sshd_nodes.known_hosts}\n  ProxyJump node1\n")
    host = Host("behind")
    target = resolve(host, load_config(cfg))
    assert [t.alias for t in target.proxy_jump] == ["node1"]
    with node_class(host, target, timeout=TIMEOUT) as node:
        # the server sees the connection arrive from node1's sshd, not from us directly
        server_side = node.run("echo $SSH_CONNECTION").stdout.split()
        assert server_side[2:] == ["127.0.0.3", str(n2.port)]
        assert node.peer_address == "127.0.0.3"
        # the hop's TCP socket sends at once; the channel through it is no socket
        hop = node._hops[0] if node_class is ssh.SSHNode else node.conn.gateway.client
        assert hop.get_transport().sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert not isinstance(node.client.get_transport().sock, socket.socket)
    broken = tmp_path / "broken"
    broken.write_text(f"Host behind\n  HostName 127.0.0.3\n  Port {n2.port}\n"
                      f"  ProxyJump 127.0.0.4:1\n")
    with pytest.raises(ssh.ConnectFailed, match="via jump host 127.0.0.4: connection refused"):
        node_class(host, resolve(host, load_config(broken)), timeout=TIMEOUT).connect()


def _sync(node, src, remote, excludes, compare="mtime", on_bytes=None):
    """What ``fluidctl cluster sync`` does per node: plan, then send what differs."""
    plan = sync.plan_sync(node, src, remote, excludes, compare)
    sync.send_files(node, plan, on_bytes)
    return plan


def test_sync_sends_only_changed_files(node1, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('v1')\n")
    (src / "pkg" / "lib.py").write_text("X = 1\n")
    (src / "data.bin").write_bytes(os.urandom(300_000))
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    (src / "big.ckpt").write_bytes(b"0" * 10)
    remote = str(tmp_path / "remote" / "ws")
    sent = []
    excludes = (*sync.DEFAULT_EXCLUDES, "*.ckpt")
    plan = _sync(node1, src, remote, excludes, on_bytes=sent.append)
    assert sorted(os.path.relpath(f.remote, remote) for f in plan.send) == [
        "data.bin", "pkg/lib.py", "train.py"]
    assert sum(sent) == plan.bytes == 300_000 + 12 + 6
    assert (tmp_path / "remote/ws/data.bin").read_bytes() == (src / "data.bin").read_bytes()
    assert not (tmp_path / "remote/ws/.git").exists()
    assert not (tmp_path / "remote/ws/big.ckpt").exists()
    assert not [p for p in (tmp_path / "remote/ws").rglob("*.tmp")]
    again = _sync(node1, src, remote, excludes)
    assert again.send == [] and again.unchanged == 3
    (src / "train.py").write_text("print('v2')\n")          # same size, new content
    os.utime(src / "train.py", (time.time() + 5, time.time() + 5))
    third = _sync(node1, src, remote, excludes)
    assert [os.path.relpath(f.remote, remote) for f in third.send] == ["train.py"]
    assert (tmp_path / "remote/ws/train.py").read_text() == "print('v2')\n"
    # hash mode: a same-size change whose mtime was kept is still seen
    stamp = os.stat(src / "pkg" / "lib.py").st_mtime
    (src / "pkg" / "lib.py").write_text("X = 2\n")
    os.utime(src / "pkg" / "lib.py", (stamp, stamp))
    assert sync.plan_sync(node1, src, remote, excludes).send == []
    fourth = _sync(node1, src, remote, excludes, compare="hash")
    assert [os.path.relpath(f.remote, remote) for f in fourth.send] == ["pkg/lib.py"]
    assert (tmp_path / "remote/ws/pkg/lib.py").read_text() == "X = 2\n"


def test_connect_all_in_parallel(cluster):
    hosts, targets = cluster
    connected = ssh.connect_all(hosts, targets, timeout=TIMEOUT)
    try:
        assert connected.failures == {}
        outputs = ssh.parallel(list(connected.nodes.values()),
                               lambda n: n.run("echo $SSH_CONNECTION").stdout.split()[2])
        assert outputs == ["127.0.0.2", "127.0.0.3"]
    finally:
        connected.close()


def test_fabric_nodes_run_in_parallel_with_env_and_exit_code(cluster):
    hosts, targets = cluster
    connected = ssh.connect_all(hosts + [Host("127.0.0.4", port=1)], {
        **targets, "127.0.0.4": resolve(Host("127.0.0.4", port=1))}, timeout=TIMEOUT,
        node_class=fabric.FabricNode)
    try:
        assert list(connected.failures) == ["127.0.0.4"]
        assert "connection refused at 127.0.0.4:1" in connected.failures["127.0.0.4"]
        results = ssh.parallel(list(connected.nodes.values()), lambda n: n.run(
            "echo $SSH_CONNECTION | cut -d' ' -f3; echo $X >&2; exit 4", env={"X": "x y"}))
        # the command's own stderr is its last line: the login shell's rc files may say
        # something first (pyenv's rehash, racing another session's, prints to stderr)
        assert [(r.host, r.exit_code, r.stdout, r.stderr.splitlines()[-1:]) for r in results] \
            == [("node1", 4, "127.0.0.2", ["x y"]), ("node2", 4, "127.0.0.3", ["x y"])]
    finally:
        connected.close()


def test_fabric_refuses_unknown_host_keys(sshd_nodes, tmp_path):
    """Fabric's own default would trust any key; ours must not."""
    port = sshd_nodes.nodes["node1"].port
    config = config_with_known_hosts(sshd_nodes, tmp_path, "n", "node1", tmp_path / "kh")
    with pytest.raises(ssh.ConnectFailed, match="not in known_hosts"):
        fabric.FabricNode(Host("n"), resolve(Host("n"), config), timeout=TIMEOUT).connect()
    node = fabric.FabricNode(Host("n"), resolve(Host("n"), config, accept_new=True),
                             timeout=TIMEOUT).connect()
    node.close()
    assert (tmp_path / "kh").read_text().startswith(f"[127.0.0.2]:{port} ssh-ed25519 ")
