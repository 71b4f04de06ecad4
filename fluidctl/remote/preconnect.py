"""Connections to an SSH job's nodes, opened while the rest of its command line is checked.

Everything on a node (sshd's session, the login shell, the agent's interpreter) waits for the
launcher's first connection, and that waited on its own start: the interpreter, paramiko and
then the planner and the launcher's modules (25-30 ms more). ``start`` connects to the nodes
of --hostfile/--hosts (as many as bring-up works on at once, ``ssh.PARALLEL``) as soon as
paramiko is in, on threads; ``LaunchConfig`` checks the options meanwhile, and ``bring_up``
takes the connections it needs (``take``). The rest are closed (``close``): a node the ledger
or --nodes leaves out, or every one when an option was refused. A connection is only
authenticated; nothing runs on a node before its agent starts, which is after every option
has been checked.

The ssh and fabric backends connect early. Whatever ``start`` cannot work out (a hostfile, an
ssh config or a --ssh-timeout it cannot read) connects nothing: the normal path says what is
wrong, as before.
"""
from __future__ import annotations

import sys
import threading
from typing import Dict, Mapping, Optional

_current: Optional["PreConnect"] = None


class PreConnect:
    """One connection attempt per host, each on its own daemon thread (bounded by the
    connection's own timeout); the GIL's switch interval is short meanwhile, so that the
    handshakes are not held 5 ms at a time behind the option checks' imports."""

    def __init__(self, hosts, targets: Mapping[str, object], timeout: float, node_class):
        self._lock = threading.Lock()
        self._found: Dict[str, tuple] = {}          # name -> (target, node, ConnectFailed)
        self._threads: Dict[str, threading.Thread] = {}
        self._closed = False
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        for host in hosts:
            thread = threading.Thread(target=self._connect, name=f"preconnect-{host.name}",
                                      args=(node_class, host, targets[host.name], timeout),
                                      daemon=True)
            self._threads[host.name] = thread
            thread.start()

    def _connect(self, node_class, host, target, timeout) -> None:
        from fluidctl.remote.ssh import ConnectFailed
        node = node_class(host, target, timeout=timeout, timeout_option="--ssh-timeout")
        try:
            node.connect()
            found = (target, node, None)
        except ConnectFailed as exc:
            found = (target, None, exc)
        with self._lock:
            if not self._closed:
                self._found[host.name] = found
                return
        if found[1] is not None:        # nobody will take it any more
            found[1].close()

    def take(self, name: str, target, node_class):
        """The node ``name``, connected to ``target`` as a ``node_class``: waits for its
        attempt; raises its ConnectFailed. None when it was not connected early, or to
        another target, or by another class."""
        thread = self._threads.pop(name, None)
        if thread is None:
            return None
        thread.join()
        with self._lock:
            found = self._found.pop(name, None)
        if found is None:
            return None
        connected_to, node, failed = found
        if connected_to != target or (node is not None and type(node) is not node_class):
            if node is not None:
                node.close()
            return None
        if failed is not None:
            raise failed
        return node

    def close(self) -> None:
        """Close what was not taken; an attempt still under way closes its own."""
        with self._lock:
            self._closed = True
            left, self._found = self._found, {}
        for _, node, _ in left.values():
            if node is not None:
                node.close()
        self._threads = {}
        sys.setswitchinterval(self._switch)


def start(options: Mapping[str, object]) -> None:
    """Connect early to the nodes of ``options`` (``fluidctl train``'s, as parsed, with its
    ``backend`` chosen) when the job runs over the ssh or fabric backend."""
    global _current
    if _current is not None or options.get("health_gate"):    # the gate connects itself
        return
    backend = options.get("backend")
    if backend not in ("ssh", "fabric"):
        return
    if not (options.get("hostfile") or options.get("hosts_arg")):
        return
    try:
        from fluidctl.planning.hosts import load_hosts
        from fluidctl.remote.ssh import DEFAULT_TIMEOUT, PARALLEL, SSHNode
        from fluidctl.remote.sshconfig import resolve_hosts
        hosts = load_hosts(options.get("hostfile"), options.get("hosts_arg"))
        resolved, targets = resolve_hosts(hosts, options.get("ssh_config"),
                                          bool(options.get("accept_new_host_keys")))
        timeout = float(options.get("ssh_timeout") or DEFAULT_TIMEOUT)
    except Exception:       # noqa: BLE001 - the normal path reports it, in its own words
        return
    if backend == "fabric":
        from fluidctl.remote.fabric import FabricNode as node_class
    else:
        node_class = SSHNode
    # as many as bring-up works on at once: its first wave (the others connect then)
    _current = PreConnect(resolved[:PARALLEL], targets, timeout, node_class)


def take(name: str, target, node_class):
    """The early connection to node ``name`` (see ``PreConnect.take``), or None."""
    return _current.take(name, target, node_class) if _current is not None else None


def close() -> None:
    """Close the early connections nobody took (the end of bring-up, or a refused option)."""
    global _current
    if _current is not None:
        _current.close()
        _current = None
