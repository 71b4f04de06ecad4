"""Nodes with their own network stack: one Linux network namespace per node on a bridge, each
with its own address in 198.18.0.0/15 (reserved for benchmark networks; no route out of the
bridge), its own sshd, and its own cgroups, so that a test can cut a node's link, cap it, freeze
the node or throttle its CPU, as real nodes fail.

    nodes = NetnsNodes.start(workdir, 4)          # node1..node4 on 198.18.<k>.11..14
    nodes.hostfile()                               # "node1 slots=1" ... (aliases in nodes.config)
    nodes.link_down("node2"); nodes.freeze("node3"); nodes.cap_link("node4", "10mbit")
    nodes.cut_between("node1", "node2")            # both still reach the launcher
    nodes.stop()                                   # every process, namespace, link, cgroup

The launcher (the test process) stays in the root namespace and reaches the nodes through the
bridge's address 198.18.<k>.1; the nodes see each other and that address, nothing else. Every
name made carries the fixture's id (``flns<id>``), and ``stop`` removes each by name, so a
crashed test leaves nothing a later ``stop_stale()`` cannot find.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from sshd import SSHD, SSHNode, SSHNodes, make_keys, wait_listening

PREFIX = "flns"                          # every namespace, link, bridge and cgroup starts so
LOCK = Path("/tmp/fluidctl-netns.lock")  # serialises subnet choice between pytest workers
# Interfaces come and go while namespace nodes are made and removed; Open MPI 5.0.11's mpirun,
# started meanwhile, has died of SIGSEGV at its start up to three times in a row (suite runs
# s53-s56, each time beside a namespace set-up). A test that runs mpirun holds this shared
# (tests/conftest.py), the making and removing of namespace nodes holds it exclusive.
INTERFACES_LOCK = Path("/tmp/fluidctl-interfaces.lock")


def interfaces_changing():
    """Hold INTERFACES_LOCK exclusive: no mpirun of a test starts meanwhile."""
    import contextlib

    @contextlib.contextmanager
    def held():
        with open(INTERFACES_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
    return held()
FREEZER = Path("/sys/fs/cgroup/freezer")
CPU = Path("/sys/fs/cgroup/cpu")


def sh(*argv: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res


def available() -> str:
    """Empty where namespace nodes can be made here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"{tool} not installed (apt-get install iproute2)"
    why = SSHNodes.available()
    if why:
        return why
    name = f"{PREFIX}probe{os.getpid() % 100000}"
    res = sh("ip", "netns", "add", name, check=False)
    if res.returncode != 0:
        return f"ip netns add failed: {res.stderr.strip()}"
    sh("ip", "netns", "del", name, check=False)
    return ""


@dataclass
class NetnsNode(SSHNode):
    netns: str = ""
    veth: str = ""                         # the root-side end, on the bridge
    cgroups: List[Path] = field(default_factory=list)


@dataclass
class NetnsNodes(SSHNodes):
    fid: str = ""
    bridge: str = ""
    subnet: int = 0                        # the third octet: 198.18.<subnet>.0/24
    gateway: str = ""                      # the root namespace's address on the bridge

    # --- making ---------------------------------------------------------------------
    @classmethod
    def start(cls, workdir: Path, n: int = 4, sftp: bool = True) -> "NetnsNodes":  # type: ignore[override]
        host_key, host_pub, user_key, authorized = make_keys(workdir)
        nodes = cls(workdir, user_key, workdir / "known_hosts", workdir / "ssh_config",
                    host_pub, fid=uuid.uuid4().hex[:5])
        nodes.bridge = f"{PREFIX}{nodes.fid}b"
        try:
            with interfaces_changing():
                with open(LOCK, "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    nodes.subnet = nodes._free_subnet()
                    nodes.gateway = f"198.18.{nodes.subnet}.1"
                    sh("ip", "link", "add", nodes.bridge, "type", "bridge")
                    sh("ip", "addr", "add", f"{nodes.gateway}/24", "dev", nodes.bridge)
                    sh("ip", "link", "set", nodes.bridge, "up")
                for k in range(1, n + 1):
                    nodes.nodes[f"node{k}"] = nodes._make_node(k, host_key, authorized, sftp)
            deadline = time.monotonic() + 20
            for node in nodes.nodes.values():
                wait_listening(node.address, node.port, node.proc, deadline)
        except BaseException:
            nodes.stop()
            raise
        nodes.known_hosts.write_text("".join(
            f"{m.address} {host_pub}\n" for m in nodes.nodes.values()))   # port 22: bare
        nodes.config.write_text("".join(
            f"Host {m.alias}\n    HostName {m.address}\n    Port {m.port}\n    User root\n"
            f"    IdentityFile {user_key}\n    UserKnownHostsFile {nodes.known_hosts}\n"
            f"    StrictHostKeyChecking yes\n\n" for m in nodes.nodes.values()))
        return nodes

    def _free_subnet(self) -> int:
        used = sh("ip", "-o", "-4", "addr", "show").stdout
        for octet in range(1, 255):
            if f"198.18.{octet}." not in used:
                return octet
        raise RuntimeError("no free /24 in 198.18.0.0/16 for namespace nodes")

    def _make_node(self, k: int, host_key: Path, authorized: Path, sftp: bool) -> NetnsNode:
        alias, ns = f"node{k}", f"{PREFIX}{self.fid}n{k}"
        veth, peer = f"{PREFIX}{self.fid}v{k}", f"{PREFIX}{self.fid}p{k}"
        address = f"198.18.{self.subnet}.{10 + k}"
        node = NetnsNode(alias, address, 22, None, self.workdir / f"sshd.{alias}.log",  # type: ignore[arg-type]
                         netns=ns, veth=veth)
        self.nodes[alias] = node                 # so that stop() finds a half-made node
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge)
        sh("ip", "link", "set", veth, "up")
        inside = ("ip", "netns", "exec", ns)
        sh(*inside, "ip", "link", "set", peer, "name", "eth0")
        sh(*inside, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        sh(*inside, "ip", "link", "set", "eth0", "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        for root in (FREEZER, CPU):              # sshd's children inherit both
            path = root / f"{PREFIX}{self.fid}n{k}"
            try:
                path.mkdir()
                node.cgroups.append(path)
            except OSError:
                pass
        conf = self.workdir / f"sshd_config.{alias}"
        conf.write_text(
            f"ListenAddress {address}:22\nHostKey {host_key}\n"
            f"PidFile {self.workdir / f'sshd.{alias}.pid'}\nAuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUsePAM no\n"
            "StrictModes no\nPrintMotd no\nAllowTcpForwarding yes\nMaxStartups 50:30:100\n"
            "MaxSessions 50\nClientAliveInterval 0\n"
            f"SetEnv FLUIDCTL_STATE_DIR={self.workdir / 'state' / alias}\n"   # not ~/.fluidctl
            + ("Subsystem sftp internal-sftp\n" if sftp else ""))
        node.proc = subprocess.Popen([*inside, SSHD, "-D", "-e", "-f", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=open(node.log, "wb"),
                                     stdin=subprocess.DEVNULL)
        # joined from here (ip netns exec remounts /sys without the cgroups); sshd's children,
        # sessions, agents and ranks, inherit both
        for path in node.cgroups:
            (path / "cgroup.procs").write_text(str(node.proc.pid))
        return node

    # --- faults ---------------------------------------------------------------------
    def node(self, alias: str) -> NetnsNode:
        return self.nodes[alias]  # type: ignore[return-value]

    def pids(self, alias: str) -> List[int]:
        """Every process running in the node's namespace (sshd, agents, ranks)."""
        out = sh("ip", "netns", "pids", self.node(alias).netns, check=False).stdout
        return [int(p) for p in out.split()]

    def link_down(self, alias: str) -> None:
        """Cut the node off: its end of the link goes down, packets to it are dropped."""
        sh("ip", "netns", "exec", self.node(alias).netns, "ip", "link", "set", "eth0", "down")

    def link_up(self, alias: str) -> None:
        sh("ip", "netns", "exec", self.node(alias).netns, "ip", "link", "set", "eth0", "up")

    def cap_link(self, alias: str, rate: str = "10mbit") -> None:
        """Cap the node's link both ways with a token bucket (``tc ... tbf``)."""
        node = self.node(alias)
        for argv in (("tc", "qdisc", "replace", "dev", node.veth),
                     ("ip", "netns", "exec", node.netns, "tc", "qdisc", "replace", "dev", "eth0")):
            sh(*argv, "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")

    def cut_between(self, one: str, other: str) -> None:
        """Cut the path between two nodes, not their links: each drops what it sends to the
        other (a blackhole route); both still reach the launcher and it them."""
        for alias, peer in ((one, other), (other, one)):
            sh("ip", "netns", "exec", self.node(alias).netns, "ip", "route", "add", "blackhole",
               f"{self.node(peer).address}/32")

    def _cgroup(self, alias: str, root: Path) -> Optional[Path]:
        return next((p for p in self.node(alias).cgroups if p.parent == root), None)

    def freeze(self, alias: str) -> None:
        """Freeze every process of the node (cgroup v1 freezer): alive, silent, unkillable
        by the node itself, as a node in a kernel or hypervisor stall."""
        path = self._cgroup(alias, FREEZER)
        if path is None:
            raise RuntimeError("no cgroup v1 freezer here")
        (path / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (path / "freezer.state").read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{alias} did not freeze")
            time.sleep(0.01)

    def thaw(self, alias: str) -> None:
        path = self._cgroup(alias, FREEZER)
        if path is not None:
            (path / "freezer.state").write_text("THAWED")

    def throttle_cpu(self, alias: str, fraction: float = 0.1) -> None:
        """Give the node ``fraction`` of one core (cgroup v1 cpu quota)."""
        path = self._cgroup(alias, CPU)
        if path is None:
            raise RuntimeError("no cgroup v1 cpu controller here")
        (path / "cpu.cfs_period_us").write_text("100000")
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, int(100000 * fraction))))

    def kill(self, alias: str) -> None:
        """The node dies: every process in it gets SIGKILL (sshd too)."""
        self.thaw(alias)
        for pid in self.pids(alias):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # --- teardown -------------------------------------------------------------------
    def stop(self) -> None:
        with interfaces_changing():
            self._stop()

    def _stop(self) -> None:
        for alias, node in self.nodes.items():
            node = self.node(alias)
            if not node.netns:
                continue
            self.kill(alias)
            if node.proc is not None:
                try:
                    node.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + 5
            while self.pids(alias) and time.monotonic() < deadline:
                time.sleep(0.02)
            sh("ip", "netns", "del", node.netns, check=False)   # takes its veth pair along
            sh("ip", "link", "del", node.veth, check=False)
            for path in node.cgroups:
                _rmdir_cgroup(path)
        if self.bridge:
            sh("ip", "link", "del", self.bridge, check=False)


def _rmdir_cgroup(path: Path) -> None:
    deadline = time.monotonic() + 5
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def stop_stale() -> List[str]:
    """Remove every namespace, link and cgroup a crashed run left (names start with flns)."""
    removed = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            sh("ip", "link", "del", name, check=False)
            removed.append(name)
    for root in (FREEZER, CPU):
        if root.is_dir():
            for path in root.glob(f"{PREFIX}*"):
                try:
                    (path / "freezer.state").write_text("THAWED")
                except OSError:
                    pass
                _rmdir_cgroup(path)
                removed.append(str(path))
    return removed
