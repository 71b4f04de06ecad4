"""The deep health check: ``fluidctl cluster check --deep`` and ``train --health-gate``.

Each node runs one probe (``python -m fluidctl.node.healthprobe`` over its SSH connection) and
is measured: CPU GEMM GFLOP/s and memory bandwidth (numpy, one thread), free disk and write
speed in the workspace, network bandwidth over plain TCP between node addresses (the path the
runtime's collectives take), and on GPU nodes a CuPy GEMM and a one-node NCCL allreduce. Each
figure is compared with the median of the other nodes' (its peers'); a node below
``THRESHOLD`` times that median is an outlier, named with the figure.

How it stays comparable on nodes that share hardware (and fast):
  - CPU, memory and disk are measured one node after another, for a fixed short time each,
    so no node competes with another for the same cores or disk;
  - the network is measured in rounds of disjoint pairs around a ring (node i sends to node
    i+1), every pair of a round at once; a node's figure is the best of its two pairs, so a
    slow neighbour does not make it look slow;
  - a suspect is measured again (CPU, memory, disk: up to twice more, keeping its best, each
    time right beside a peer that is not a suspect; network: against a healthy partner) and
    is named only if it stays slow, and slower than the peer measured beside it: a busy
    moment of shared hardware slows both alike, and is not a bad node.
"""
from __future__ import annotations

import json
import queue
import shlex
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fluidctl.planning.hosts import Host
from fluidctl.remote.ssh import (DEFAULT_TIMEOUT, NODE_LOST, ConnectionLost, connect_all,
                                 parallel, shell_command)

THRESHOLD = 0.5                 # an outlier measures under half its peers' median
# Figures that vary more than that on healthy hardware get a lower bar (a factor of THRESHOLD).
# Disk write speed: 8 MiB written and fsync'd waits on the file system's journal, which every
# other writer of the machine shares; healthy nodes measured 0.49x their peers' median through
# three measurements beside a busy neighbour. A disk under a quarter of its peers' is named.
SLACK: Dict[str, float] = {"write_mbps": 0.5}
CPU_SECONDS = 0.25              # GEMM per node per round (several CFS periods: a quota shows)
MEM_SECONDS = 0.1               # memory copies per node per round
CPU_ROUNDS = 1                  # rounds over the nodes; each node keeps its best
CONFIRMATIONS = 2               # a suspect is measured again up to this many times
NET_SECONDS = 0.5               # per round of pairs
DISK_MIB = 8
PROBE_LIFE_S = 120              # the probe exits by itself after this, whatever happens

# key -> (label, unit); the order of the table's columns
METRICS: Dict[str, Tuple[str, str]] = {
    "gemm_gflops": ("CPU GEMM", "GFLOP/s"),
    "mem_gbps": ("memory bandwidth", "GB/s"),
    "disk_free": ("free disk", "bytes"),
    "write_mbps": ("disk write", "MB/s"),
    "net_gbps": ("network", "Gbit/s"),
    "gpu_tflops": ("GPU GEMM", "TFLOP/s"),
    "nccl_gbps": ("NCCL allreduce", "GB/s"),
}


@dataclass
class NodeHealth:
    host: str
    address: str = ""
    figures: Dict[str, float] = field(default_factory=dict)
    medians: Dict[str, float] = field(default_factory=dict)    # the peers' median per figure
    outliers: List[str] = field(default_factory=list)          # one line per low figure
    notes: List[str] = field(default_factory=list)             # what was skipped, and why
    reason: str = ""                                           # could not be measured
    cleared: List[str] = field(default_factory=list)   # figures as good as a peer's beside it

    @property
    def ok(self) -> bool:
        return not self.reason and not self.outliers

    def why(self) -> str:
        """One line: the reason it could not be measured, or its low figures."""
        return self.reason or "; ".join(o.split(": ", 1)[1] for o in self.outliers)


@dataclass
class HealthReport:
    nodes: List[NodeHealth]
    seconds: float
    threshold: float = THRESHOLD

    def bad(self) -> Dict[str, str]:
        """{host: why} for every node that is an outlier or could not be measured."""
        return {n.host: n.why() for n in self.nodes if not n.ok}

    def to_record(self) -> dict:
        return {"seconds": round(self.seconds, 3), "threshold": self.threshold,
                "nodes": [asdict(n) for n in self.nodes]}


def number(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}" if value < 1 else f"{value:.2f}"


def ratio(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def show(key: str, value: float) -> str:
    if key == "disk_free":
        from fluidctl.units import human_bytes
        return human_bytes(value)
    return f"{number(value)} {METRICS[key][1]}"


# --- the probe on one node ---------------------------------------------------------------
class Probe:
    """One ``fluidctl.node.healthprobe`` on a connected node: a JSON line out, one back."""

    def __init__(self, node, python: str, venv: Optional[str], timeout: float):
        self.node = node
        self.host = node.host.name
        self.timeout = timeout
        self._buf = b""
        transport = node.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionLost(f"not connected to {self.host}")
        self.channel = transport.open_session(timeout=timeout)
        env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        argv = ["-m", "fluidctl.node.healthprobe", str(PROBE_LIFE_S)]
        if venv:        # the venv's python where ``cluster setup`` made one, else ``python``
            path = venv.replace("{host}", self.host)
            path = path[2:] if path.startswith("~/") else path
            venv_py = (shlex.quote(f"{path}/bin/python") if path.startswith("/")
                       else '"$HOME"/' + shlex.quote(f"{path}/bin/python"))   # home-relative
            command = (f"P={venv_py}; [ -x \"$P\" ] || P={shlex.quote(python)}; "
                       f"exec \"$P\" {' '.join(shlex.quote(a) for a in argv)}")
        else:
            command = [python, *argv]
        self.channel.exec_command(shell_command(command, env))
        ready = self.read(timeout)
        if not ready.get("ready"):
            raise ConnectionLost(f"the probe did not start: {ready}")

    def _stderr(self) -> str:
        try:
            self.channel.settimeout(0.5)
            text = self.channel.recv_stderr(65536).decode(errors="replace").strip()
        except Exception:  # noqa: BLE001 - only for a message
            text = ""
        return text.splitlines()[-1] if text else ""

    def read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.host}: no answer from the probe within {timeout:g} s")
            self.channel.settimeout(left)
            try:
                data = self.channel.recv(65536)
            except OSError as exc:      # socket.timeout included
                raise TimeoutError(f"{self.host}: no answer from the probe within "
                                   f"{timeout:g} s") from exc
            if not data:
                why = self._stderr()
                raise ConnectionLost(f"the probe ended{': ' + why if why else ''} (is "
                                     "fluidctl installed for that python there?)")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def ask(self, request: dict, timeout: Optional[float] = None) -> dict:
        self.channel.sendall((json.dumps(request) + "\n").encode())
        return self.read(timeout or self.timeout)

    def close(self) -> None:
        try:
            self.channel.shutdown_write()           # EOF: the probe exits
            self.channel.close()
        except Exception:  # noqa: BLE001 - closing a lost channel
            pass


# --- comparing ---------------------------------------------------------------------------
def bar(key: str, threshold: float = THRESHOLD) -> float:
    """The fraction of the peers' median under which ``key`` names a node."""
    return threshold * SLACK.get(key, 1.0)


def compare(nodes: Sequence[NodeHealth], threshold: float = THRESHOLD) -> None:
    """Fill each node's ``medians`` and ``outliers`` from its figures and its peers'."""
    for node in nodes:
        node.medians.clear()
        node.outliers.clear()
    for key, (label, _) in METRICS.items():
        have = [n for n in nodes if key in n.figures]
        if len(have) < 2:
            continue
        for node in have:
            median = statistics.median(p.figures[key] for p in have if p is not node)
            node.medians[key] = median
            value = node.figures[key]
            if median > 0 and value < bar(key, threshold) * median and key not in node.cleared:
                node.outliers.append(f"{node.host}: {label} {show(key, value)}, "
                                     f"{ratio(value / median)}x the peers' median "
                                     f"{show(key, median).split(' ')[0]}")


def suspects(nodes: Sequence[NodeHealth], keys: Sequence[str],
             threshold: float = THRESHOLD) -> List[NodeHealth]:
    compare(nodes, threshold)
    return [n for n in nodes if _low(n, keys, threshold)]


def _low(node: NodeHealth, keys: Sequence[str], threshold: float) -> List[str]:
    return [k for k in keys if k in node.figures and k not in node.cleared
            and node.medians.get(k) and node.figures[k] < bar(k, threshold) * node.medians[k]]


def confirm_suspects(nodes: Sequence[NodeHealth], remeasure: Callable[[str, bool], dict],
                     keys: Sequence[str], threshold: float = THRESHOLD,
                     say: Optional[Callable[[str, str], None]] = None,
                     rounds: int = CONFIRMATIONS) -> None:
    """Measure each suspect again, up to ``rounds`` times, each time right beside a peer that
    is not one: a busy moment of shared hardware slows both alike, so a suspect that then
    measures at least ``threshold`` times that peer is cleared of the figure (a busy moment is
    not a bad node); one that stays under it every time stays an outlier.
    ``remeasure(host, keep)`` measures a node and returns the fresh figures; with ``keep`` the
    node keeps its best. The peer's are not kept: its best of several would raise the median
    every other node is compared with."""
    for _ in range(rounds):
        slow = suspects(nodes, keys, threshold)
        if not slow:
            return
        peers = [n for n in nodes if n not in slow]
        for i, node in enumerate(slow):
            low = _low(node, keys, threshold)
            if say:
                say(node.host, "slow: measuring CPU, memory and disk again, beside a peer")
            mine = remeasure(node.host, True) or {}
            if not peers:
                continue
            theirs = remeasure(peers[i % len(peers)].host, False) or {}
            node.cleared += [k for k in low if k in mine and theirs.get(k)
                             and mine[k] >= bar(k, threshold) * theirs[k]]


def ring_rounds(count: int) -> List[List[Tuple[int, int]]]:
    """Node i sends to node i+1 around the ring, in rounds of disjoint pairs: two rounds for
    an even count, three for an odd one."""
    if count < 2:
        return []
    edges = [(i, (i + 1) % count) for i in range(count if count > 2 else 1)]
    return disjoint_rounds(edges)


def disjoint_rounds(edges: Sequence[Tuple[int, int]]) -> List[List[Tuple[int, int]]]:
    rounds: List[List[Tuple[int, int]]] = []
    busy: List[set] = []
    for a, b in edges:
        for r, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[r].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds


# --- measuring ---------------------------------------------------------------------------
class _Measure:
    def __init__(self, probes: Dict[str, Probe], health: Dict[str, NodeHealth], say):
        self.probes, self.health, self.say = probes, health, say
        self.names = list(probes)
        self._lock = threading.Lock()           # pairs of a round fail from their threads

    def _fail(self, host: str, why: str) -> None:
        with self._lock:
            self.health[host].reason = why
            probe = self.probes.pop(host, None)
            if host in self.names:
                self.names.remove(host)
        if probe:
            probe.close()

    def ask(self, host: str, request: dict, timeout: float) -> Optional[dict]:
        probe = self.probes.get(host)
        if probe is None:
            return None
        try:
            return probe.ask(request, timeout)
        except (TimeoutError, ConnectionLost, *NODE_LOST) as exc:
            self._fail(host, str(exc))
            return None

    def cpu(self, host: str, keep: bool = True) -> dict:
        """Measure (with ``keep``, the node keeps its best figures); this measurement's."""
        got = self.ask(host, {"op": "cpu", "seconds": CPU_SECONDS, "mem_seconds": MEM_SECONDS},
                       30)
        if got and keep:
            self._keep(self.health[host], got,
                       {"gemm_gflops": "gemm_gflops", "mem_gbps": "mem_gbps"}, "CPU")
        return got or {}

    def disk(self, host: str, workdir: Optional[str], keep: bool = True) -> dict:
        node = self.health[host]
        got = self.ask(host, {"op": "disk", "dir": workdir, "mib": DISK_MIB}, 30)
        if got and keep:
            self._keep(node, got, {"disk_free": "disk_free", "write_mbps": "write_mbps"}, "disk")
        return got or {}

    @staticmethod
    def _keep(node: NodeHealth, got: dict, keys: Dict[str, str], what: str) -> None:
        if "skipped" in got or "error" in got:
            note = f"{what}: {got.get('skipped') or got.get('error')}"
            if note not in node.notes:
                node.notes.append(note)
            return
        for src, key in keys.items():
            if src in got:          # a second measurement keeps the better one
                node.figures[key] = max(got[src], node.figures.get(key, 0.0))

    def gpu(self, host: str) -> None:
        node = self.health[host]
        got = self.ask(host, {"op": "gpu", "seconds": CPU_SECONDS}, 120)
        if not got:
            return
        if "skipped" in got or "error" in got:
            node.notes.append(f"GPU: skipped ({got.get('skipped') or got.get('error')})")
            return
        if got.get("gemm_tflops"):
            node.figures["gpu_tflops"] = min(got["gemm_tflops"])
        if "nccl_busbw_gbps" in got:
            node.figures["nccl_gbps"] = got["nccl_busbw_gbps"]
        else:
            skipped = got.get("nccl_skipped")
            node.notes.append(f"NCCL: {skipped}" if skipped and skipped.startswith("one GPU")
                              else f"NCCL: skipped ({skipped or got.get('nccl_error')})")

    def pair(self, sender: str, receiver: str) -> Optional[float]:
        """Bandwidth from ``sender`` to ``receiver`` over TCP, as the receiver counts it."""
        got = self.ask(receiver, {"op": "listen", "seconds": NET_SECONDS, "accept_timeout": 5}, 10)
        if not got or "port" not in got:
            return None
        address = self.health[receiver].address
        self.ask(sender, {"op": "send", "host": address, "port": got["port"],
                          "seconds": NET_SECONDS}, NET_SECONDS + 10)
        got = self.ask(receiver, {"op": "received"}, NET_SECONDS + 12)
        if not got or "gbps" not in got:
            if got and receiver in self.health:
                self.health[receiver].notes.append(f"network from {sender}: {got.get('error')}")
            return None
        return got["gbps"]

    def network_round(self, pairs: Sequence[Tuple[str, str]]) -> None:
        results = parallel(list(pairs), lambda p: self.pair(*p))
        for (a, b), gbps in zip(pairs, results):
            if gbps is None:
                continue
            for host in (a, b):     # a node's figure: the best of its pairs
                node = self.health[host]
                node.figures["net_gbps"] = max(gbps, node.figures.get("net_gbps", 0.0))


def measure(hosts: Sequence[Host], targets, *, python: Optional[str] = None,
            venv: Optional[str] = None, workdirs: Optional[Dict[str, str]] = None,
            timeout: float = DEFAULT_TIMEOUT, threshold: float = THRESHOLD,
            say: Optional[Callable[[str, str], None]] = None) -> HealthReport:
    """Measure every node (see the module's doc) and name the outliers."""
    started = time.monotonic()
    python = python or sys.executable
    say = say or (lambda host, text: None)
    health = {h.name: NodeHealth(h.name, address=targets[h.name].hostname) for h in hosts}
    connected = connect_all(hosts, targets, timeout=timeout)
    for name, why in connected.failures.items():
        health[name].reason = why
    lock = threading.Lock()
    probes: Dict[str, Probe] = {}
    ready: "queue.Queue[str]" = queue.Queue()

    def start(name: str) -> None:
        node = connected.nodes[name]
        health[name].address = node.peer_address
        try:
            probe = Probe(node, python, venv, timeout)
            with lock:
                probes[name] = probe
        except (TimeoutError, ConnectionLost, *NODE_LOST) as exc:
            health[name].reason = str(exc)
        finally:
            ready.put(name)
    starting = [h.name for h in hosts if h.name in connected.nodes]
    for name in starting:       # every probe starts at once; each is measured once it is up
        threading.Thread(target=start, args=(name,), daemon=True,
                         name=f"health-{name}").start()
    m = _Measure({}, health, say)
    try:
        workdirs = workdirs or {}
        for _ in starting:          # CPU, memory, disk: one node after the other
            try:
                name = ready.get(timeout=2 * timeout + 5)
            except queue.Empty:
                break
            with lock:
                if name not in probes:
                    continue
                m.probes[name] = probes[name]
            m.names.append(name)
            for _ in range(CPU_ROUNDS):
                m.cpu(name)
            m.disk(name, workdirs.get(name))
            say(name, "CPU, memory and disk measured")
        for name in starting:
            if name not in m.probes and not health[name].reason:
                health[name].reason = f"the probe did not start within {2 * timeout + 5:g} s"
        m.names.sort(key=starting.index)            # the ring in hostfile order
        # a busy moment is not a bad node: suspects are measured again, beside a peer
        confirm_suspects([health[n] for n in m.names],
                         lambda host, keep: {**m.cpu(host, keep),
                                             **m.disk(host, workdirs.get(host), keep)},
                         ("gemm_gflops", "mem_gbps", "write_mbps"), threshold, say)
        parallel(list(m.names), m.gpu)              # each node's own GPUs: at once
        names = list(m.names)
        for pairs in ring_rounds(len(names)):
            m.network_round([(names[a], names[b]) for a, b in pairs])
        live = [health[n] for n in m.names]
        slow = suspects(live, ("net_gbps",), threshold)
        good = sorted((n for n in live if n not in slow and "net_gbps" in n.figures),
                      key=lambda n: -n.figures["net_gbps"])
        if slow and good:                           # again, each against a healthy partner
            edges = [(i, len(slow) + (i % len(good))) for i in range(len(slow))]
            order = [n.host for n in slow] + [n.host for n in good]
            for pairs in disjoint_rounds(edges):
                m.network_round([(order[a], order[b]) for a, b in pairs])
        compare([health[n] for n in m.names], threshold)
    finally:
        with lock:
            for probe in probes.values():
                probe.close()
        connected.close()
    return HealthReport([health[h.name] for h in hosts], time.monotonic() - started, threshold)


# --- ``fluidctl cluster check --deep`` ---------------------------------------------------
def print_report(report: HealthReport) -> None:
    from fluidctl.tables import print_table
    keys = [k for k in METRICS if any(k in n.figures for n in report.nodes)]
    rows = []
    for n in report.nodes:
        cells = [show(k, n.figures[k]).split(" ")[0] if k != "disk_free" and k in n.figures
                 else (show(k, n.figures[k]) if k in n.figures else "-") for k in keys]
        rows.append([n.host, *cells, "ok" if n.ok else ("FAIL" if n.reason else "OUTLIER")])
    columns = [f"{METRICS[k][0]} ({METRICS[k][1]})" if k != "disk_free" else METRICS[k][0]
               for k in keys]
    print_table(f"fluidctl cluster check --deep: {len(report.nodes)} node(s) in "
                f"{report.seconds:.1f} s", ["host", *columns, "status"], rows,
                justify=["left"] + ["right"] * len(keys) + ["left"])
    notes: Dict[str, List[str]] = {}
    for n in report.nodes:
        for note in n.notes:
            notes.setdefault(note, []).append(n.host)
    for note, hosts in notes.items():
        where = "every node" if len(hosts) == len(report.nodes) else ", ".join(hosts)
        print(f"{where}: {note}", flush=True)
    for n in report.nodes:
        if n.reason:
            print(f"{n.host}: not measured: {n.reason}", flush=True)
        for line in n.outliers:
            print(line, flush=True)


def run(hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, python=None, remote_dir=None, venv=None,
        as_json=False) -> None:
    """``fluidctl cluster check --deep``: measure, print (or JSON), exit 1 naming outliers."""
    import contextlib
    from fluidctl.cluster.nodes import resolve
    from fluidctl.remote.progress import NodeProgress
    from fluidctl.errors import FluidctlError
    from fluidctl.paths import NODE_VENV
    hosts, targets = resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    venv = None if python else (venv or NODE_VENV)      # an explicit --python wins
    workdirs = {h.name: remote_dir.replace("{host}", h.name) for h in hosts} if remote_dir \
        else None
    shown = contextlib.nullcontext(None) if as_json else \
        NodeProgress([h.name for h in hosts], timeout=timeout)
    with shown as say:
        report = measure(hosts, targets, python=python, venv=venv, workdirs=workdirs,
                         timeout=timeout, say=say)
    if as_json:
        print(json.dumps(report.to_record(), indent=1), flush=True)
    else:
        print_report(report)
    bad = report.bad()
    if bad:
        raise FluidctlError(f"{len(bad)} of {len(report.nodes)} node(s) failed the deep "
                            f"check: {', '.join(bad)}", "see the lines above; train "
                            "--health-gate leaves such nodes out", exit_code=1)
