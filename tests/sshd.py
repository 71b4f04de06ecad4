"""Real OpenSSH servers on loopback addresses, for the multi-node tests.

``SSHNodes.start(workdir)`` generates a host key, a user key, an ``authorized_keys``, a
``known_hosts`` and an ssh config (``Host node1`` -> 127.0.0.2, ``Host node2`` -> 127.0.0.3), then
starts one Debian ``/usr/sbin/sshd -D`` per address on a free port and waits until each accepts
TCP connections. ``stop()`` ends every sshd it started, and the per-connection children they
forked, by pid.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import psutil

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")          # Debian's sshd refuses to start without it
ADDRESSES = {"node1": "127.0.0.2", "node2": "127.0.0.3"}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def wait_listening(address: str, port: int, proc: subprocess.Popen, deadline: float) -> None:
    """Poll a TCP connect until sshd accepts (or fails: then show its log)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {address}:{port} exited with {proc.returncode}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"sshd on {address}:{port} not listening after the deadline")


def _port_taken(node) -> bool:
    try:
        return node.proc.poll() is not None and \
            "Address already in use" in Path(node.log).read_text(errors="replace")
    except OSError:
        return False


def keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return Path(str(path) + ".pub").read_text().strip()


def make_keys(workdir: Path):
    """A host key, a user key and an authorized_keys holding it, in ``workdir``: (host key,
    its public line, user key, authorized_keys)."""
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "ssh_host_ed25519_key"
    host_pub = keygen(host_key, "fluidctl-test-host")
    user_key = workdir / "id_ed25519"
    user_pub = keygen(user_key, "fluidctl-test-user")
    authorized = workdir / "authorized_keys"
    authorized.write_text(user_pub + "\n")
    authorized.chmod(0o600)
    return host_key, host_pub, user_key, authorized


@dataclass
class SSHNode:
    alias: str
    address: str
    port: int
    proc: subprocess.Popen
    log: Path


def _is_rank(proc: psutil.Process) -> bool:
    """A process an agent started for a rank, not its lifeline watchdog (sh)."""
    try:
        return not os.path.basename(proc.cmdline()[0]).endswith("sh")
    except (psutil.NoSuchProcess, IndexError):
        return False


@dataclass
class SSHNodes:
    workdir: Path
    user_key: Path
    known_hosts: Path
    config: Path
    host_key_pub: str
    nodes: Dict[str, SSHNode] = field(default_factory=dict)

    @property
    def aliases(self) -> List[str]:
        return list(self.nodes)

    def hostfile(self, name: str = "hostfile", slots: int = 1) -> Path:
        path = self.workdir / name
        path.write_text("".join(f"{alias} slots={slots}\n" for alias in self.nodes))
        return path

    @classmethod
    def available(cls) -> str:
        """Empty when sshd can run here, else why not (for pytest.skip)."""
        if not os.path.exists(SSHD):
            return f"{SSHD} not installed (apt-get install openssh-server)"
        if not shutil.which("ssh-keygen"):
            return "ssh-keygen not installed"
        if not PRIVSEP_DIR.is_dir():
            try:
                PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
            except OSError as exc:
                return f"cannot create {PRIVSEP_DIR}: {exc.strerror}"
        return ""

    @classmethod
    def start(cls, workdir: Path, addresses: Dict[str, str] = ADDRESSES,
              sftp: bool = True) -> "SSHNodes":
        """``sftp=False``: servers without an SFTP subsystem (nodes that have only sshd)."""
        host_key, host_pub, user_key, authorized = make_keys(workdir)
        known_hosts = workdir / "known_hosts"
        config = workdir / "ssh_config"
        nodes = cls(workdir, user_key, known_hosts, config, host_pub)
        try:
            for alias, address in addresses.items():
                nodes.nodes[alias] = nodes._start_one(alias, address, host_key, authorized,
                                                      sftp)
            deadline = time.monotonic() + 20
            for alias in list(nodes.nodes):
                for attempt in range(3):
                    node = nodes.nodes[alias]
                    try:
                        wait_listening(node.address, node.port, node.proc, deadline)
                        break
                    except RuntimeError:
                        # the free port was taken (another test's process) before sshd bound
                        # it: start this one again on another port
                        if attempt == 2 or not _port_taken(node):
                            raise
                        nodes.nodes[alias] = nodes._start_one(alias, node.address, host_key,
                                                              authorized, sftp)
        except BaseException:
            nodes.stop()
            raise
        known_hosts.write_text("".join(
            f"[{n.address}]:{n.port} {host_pub}\n" for n in nodes.nodes.values()))
        config.write_text("".join(
            f"Host {n.alias}\n    HostName {n.address}\n    Port {n.port}\n    User root\n"
            f"    IdentityFile {user_key}\n    UserKnownHostsFile {known_hosts}\n"
            f"    StrictHostKeyChecking yes\n\n" for n in nodes.nodes.values()))
        return nodes

    def _start_one(self, alias, address, host_key, authorized, sftp=True) -> SSHNode:
        port = free_port(address)
        conf = self.workdir / f"sshd_config.{alias}"
        conf.write_text(
            f"ListenAddress {address}:{port}\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.workdir / f'sshd.{alias}.pid'}\n"
            f"AuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            "AllowTcpForwarding yes\n"
            "MaxStartups 50:30:100\n"
            "MaxSessions 50\n"
            # what fluidctl keeps on the node goes to this test's directory, never ~/.fluidctl
            f"SetEnv FLUIDCTL_STATE_DIR={self.workdir / 'state' / alias}\n"
            + ("Subsystem sftp internal-sftp\n" if sftp else ""))
        log = self.workdir / f"sshd.{alias}.log"
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf)],
                                stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                                stdin=subprocess.DEVNULL)
        return SSHNode(alias, address, port, proc, log)

    def session_pids(self, alias: str, client_port: int) -> List[int]:
        """Pids of the sshd processes serving the connection from local ``client_port`` (to
        cut exactly that connection)."""
        pids = []
        try:
            children = psutil.Process(self.nodes[alias].proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for child in children:
            try:
                if any(c.raddr and c.raddr.port == client_port
                       for c in child.net_connections(kind="tcp")):
                    pids.append(child.pid)
            except psutil.Error:
                continue
        return pids

    def agent_pids(self, alias: str, running: bool = False) -> List[int]:
        """Pids of the fluidctl node agents this node's own sshd started (another test's job on
        the same loopback address has agents under another sshd); ``running``: only those
        that run ranks. An elastic job also keeps a standby agent on each node for its next
        world, and pids wrap (pid_max 32768 here), so the lowest pid need not be the job's."""
        try:
            children = psutil.Process(self.nodes[alias].proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            try:
                if "fluidctl.node.agent" in " ".join(child.cmdline()) and (
                        not running or any(_is_rank(c) for c in child.children())):
                    found.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        return found

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                children = psutil.Process(node.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            if node.proc.poll() is None:
                node.proc.terminate()
                try:
                    node.proc.wait(5)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(5)
            for child in children:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(children, timeout=5)
