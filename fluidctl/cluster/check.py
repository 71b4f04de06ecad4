"""Node checks for ``cluster check``: is each node reachable, with Python, the same fluidctl,
disk space and GPUs?

Its own module because it is about what a node must have to run fluidctl, not about SSH: one
shell probe, parsed into a NodeCheck with a reason naming what to fix. The paramiko backend runs
it below; the Fabric backend reuses the probe and the parser.
"""
from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from fluidctl import __version__
from fluidctl.remote.ssh import (DEFAULT_TIMEOUT, NODE_LOST, ConnectFailed, SFTPUnavailable,
                                 SSHNode, parallel)
from fluidctl.planning.hosts import Host
from fluidctl.remote.sshconfig import resolve_hosts


@dataclass
class NodeCheck:
    """What ``cluster check`` learns about one node."""
    host: str
    address: str = ""
    ok: bool = False
    reason: str = ""
    python: str = ""
    fluidctl: str = ""
    disk_free: Optional[int] = None     # bytes free in the remote dir (or home)
    gpus: Optional[int] = None
    gpu_stack: str = ""                 # CuPy / NCCL versions and usable GPUs, as the node sees
    seconds: float = 0.0


def probe_script(python: str, remote_dir: Optional[str]) -> str:
    """A POSIX shell script printing key=value lines about the node."""
    py = shlex.quote(python)
    where = shlex.quote(remote_dir) if remote_dir else '"$HOME"'
    return "; ".join([
        f"if ! command -v {py} >/dev/null 2>&1; then echo python=missing; exit 0; fi",
        f"echo python=$({py} -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)",
        f"if [ -d {where} ]; then echo disk=$(df -Pk {where} | awk 'NR==2 {{print $4}}'); "
        "else echo dir=missing; fi",
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "g=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); else g=0; fi; echo gpus=$g",
        # fluidctl's version and the CuPy/NCCL line in one light interpreter start
        f"{py} -m fluidctl.node.gpustack --probe $g 2>/dev/null || "
        f"echo fluidctl=$({py} -m fluidctl --version 2>/dev/null | tail -n 1)",
    ])


def parse_probe(check: NodeCheck, output: str, python: str, remote_dir: Optional[str]) -> None:
    values = dict(line.partition("=")[::2] for line in output.splitlines() if "=" in line)
    problems = []
    if values.get("python") == "missing" or not values.get("python"):
        problems.append(f"python {python} not found on the node (pass --python with the "
                        "remote interpreter, or install it at the same path)")
    else:
        check.python = values["python"]
        words = values.get("fluidctl", "").split()
        check.fluidctl = words[-1] if words else ""
        if not check.fluidctl:
            problems.append(f"fluidctl is not installed for {python} there (pip install fluidctl "
                            "on the node, or pass --python)")
        elif check.fluidctl != __version__:
            problems.append(f"fluidctl {check.fluidctl} there, {__version__} here "
                            "(install the same version on every node)")
    if values.get("dir") == "missing":
        problems.append(f"remote dir {remote_dir} does not exist (run fluidctl cluster sync or "
                        "pass --remote-dir)")
    elif values.get("disk", "").isdigit():
        check.disk_free = int(values["disk"]) * 1024
    if values.get("gpus", "").isdigit():
        check.gpus = int(values["gpus"])
    check.gpu_stack = values.get("gpu_stack", "").strip()
    check.reason = "; ".join(problems)
    check.ok = not problems


def check_nodes(hosts: Sequence[Host], ssh_config=None, timeout: float = DEFAULT_TIMEOUT,
                accept_new: bool = False, python: Optional[str] = None,
                remote_dir: Optional[str] = None, targets=None, say=None) -> List[NodeCheck]:
    """Check every node in parallel: reachable, authenticated, Python and fluidctl there, free
    disk, GPUs. One NodeCheck per host, in hostfile order; ``ok`` False says ``reason``.

    ``hosts`` may be unresolved hostfile entries (resolved here through ``ssh_config``) or
    already resolved ones with their ``targets``."""
    python = python or sys.executable
    if targets is None:
        hosts, targets = resolve_hosts(hosts, ssh_config, accept_new)

    def one(host: Host) -> NodeCheck:
        started = time.monotonic()
        check = NodeCheck(host.name, address=targets[host.name].hostname)
        node = SSHNode(host, targets[host.name], timeout=timeout, keepalive=0)
        try:
            node.connect()
            check.address = node.peer_address
            result = node.run(probe_script(python, remote_dir), timeout=timeout)
            parse_probe(check, result.stdout, python, remote_dir)
            try:                # cluster setup moves its files over SFTP: not ready without
                node.sftp
            except SFTPUnavailable as exc:
                check.ok = False
                check.reason = "; ".join([*([check.reason] if check.reason else []),
                                          str(exc)])
        except ConnectFailed as exc:
            check.reason = str(exc)
        except TimeoutError:
            check.reason = f"checks did not finish within {timeout:g}s (raise --timeout)"
        except NODE_LOST as exc:
            check.reason = f"connection failed during the checks: {exc}"
        finally:
            node.close()
            check.seconds = time.monotonic() - started
        if say:
            say(host.name, f"checked: {'ok' if check.ok else 'FAIL'} ({check.seconds:.1f} s)")
        return check
    return parallel(list(hosts), one)


def run(hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, python=None, remote_dir=None, venv=None,
        as_json=False) -> None:
    """``fluidctl cluster check``: every node checked with the interpreter it would run (its
    ``cluster setup`` venv where one exists), a table (or JSON), and exit 1 naming each failing
    node."""
    from fluidctl.cluster import setup as provision
    from fluidctl.cluster.nodes import resolve
    from fluidctl.remote.progress import NodeProgress
    from fluidctl.errors import node_failures
    from fluidctl.paths import NODE_VENV
    hosts, targets = resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    unreachable: dict = {}
    with NodeProgress([h.name for h in hosts], timeout=timeout) as say:
        envs = provision.inspect_all(hosts, targets, venv or NODE_VENV, timeout, progress=say,
                                     unreachable=unreachable)
    found = {name: NodeCheck(name, address=targets[name].hostname, reason=reason)
             for name, reason in unreachable.items()}   # not tried twice: one timeout each
    groups: dict = {}           # interpreter -> hosts checked with it (a node's venv python)
    for host in (h for h in hosts if h.name not in unreachable):
        env = envs.get(host.name)
        chosen = python or (env.executable if env and env.present else None)
        groups.setdefault(chosen, []).append(host)
    for chosen, members in groups.items():
        for r in check_nodes(members, targets=targets, timeout=timeout, python=chosen,
                             remote_dir=remote_dir, say=say):
            found[r.host] = r
    results = [found[h.name] for h in hosts]
    for r in results:
        env = envs.get(r.host)
        drift = env.differences() if env else []
        if drift:
            r.ok = False
            r.reason = "; ".join([*([r.reason] if r.reason else []), ", ".join(drift)
                                  + " (run fluidctl cluster setup)"])
    if as_json:
        import json
        print(json.dumps([_record(r, envs.get(r.host)) for r in results], indent=1),
              flush=True)
    else:
        _print_checks(results, envs)
    failures = {r.host: r.reason for r in results if not r.ok}
    if failures:
        raise node_failures("failed the check", failures, len(results), exit_code=1)


def _env_state(env) -> str:
    if env is None or not env.present:
        return "-"
    return "differs" if env.differences() else "ok"


def _record(r: NodeCheck, env) -> dict:
    """One node for ``--json``: the NodeCheck's fields and the env column's word."""
    from dataclasses import asdict
    return {**asdict(r), "env": _env_state(env),
            "venv_python": env.executable if env is not None and env.present else None}


# under this many columns a table cannot hold a node's cells: one block per node instead
NARROW = 100


def _print_checks(results: List[NodeCheck], envs: dict) -> None:
    """A table on a wide terminal, one block per node on a narrow one, plain `` | `` columns
    (no rich) elsewhere. Cells are printed as text, never as rich markup: install advice such
    as ``pip install 'fluidctl[gpu]'`` must reach the user whole."""
    from fluidctl.tables import print_table
    from fluidctl.units import human_bytes
    title = f"fluidctl cluster check: {len(results)} node(s)"
    rows = []
    for r in results:
        rows.append([r.host, r.address, "ok" if r.ok else "FAIL", _env_state(envs.get(r.host)),
                     r.python or "-", r.fluidctl or "-", human_bytes(r.disk_free),
                     "-" if r.gpus is None else str(r.gpus), r.gpu_stack or "-",
                     f"{r.seconds:.2f}", r.reason or "-"])
    if not sys.stdout.isatty():
        print_table(title, ("host", "address", "status", "env", "python", "fluidctl",
                            "free disk", "gpus", "CuPy / NCCL", "seconds", "reason"), rows)
        return
    from rich.table import Table
    from rich.text import Text
    from fluidctl.console import console
    out = console()
    if out.width < NARROW:
        out.print(title, markup=False)
        for row, r in zip(rows, results):
            host, address, status, env, py, fl, disk, gpus, stack, secs, reason = row
            out.print(Text.assemble((host, "bold"), f" ({address}): ",
                                    (status, "green" if r.ok else "bold red"), f", {secs}s"))
            out.print(Text(f"  env {env}, python {py}, fluidctl {fl}, {disk} free, "
                           f"{gpus} GPU(s)"))
            out.print(Text(f"  CuPy / NCCL: {stack}"))
            if r.reason:
                out.print(Text(f"  reason: {reason}"))
        return
    # the wide table leaves out the address and seconds; each reason follows it on its line
    table = Table(title=title)
    for column in ("host", "status", "env", "python", "fluidctl", "free disk", "gpus",
                   "CuPy / NCCL"):
        table.add_column(column, overflow="fold")
    for row, r in zip(rows, results):
        table.add_row(Text(row[0]), Text(row[2], style="green" if r.ok else "bold red"),
                      *(Text(c) for c in row[3:9]))
    out.print(table)
    for r in results:
        if r.reason:
            out.print(Text(f"{r.host}: {r.reason}"), soft_wrap=True)
