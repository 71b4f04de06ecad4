"""Ready Python environments on the nodes: ``fluidctl cluster setup`` and what uses them.

Per node (every node at once, each on its own thread and connection):

1. read what the node has: ``VENV/fluidctl-env.json`` (the wheels' sha256 it installed, the
   wheelhouse key) and the sizes in ``VENV/wheelhouse``;
2. push only the wheels whose content (sha256) it lacks, through ``sync.send_files`` (the
   SFTP transport ``cluster sync`` falls back to: a temporary name renamed into place), check
   their sha256 there, and drop wheels the wheelhouse no longer has;
3. create the venv if it is missing, then ``pip install --no-index --find-links`` every wheel
   (wheels whose content changed under the same version are reinstalled first);
4. verify: ``VENV/bin/fluidctl --version`` and ``python -c "import ..."`` of each requirement's
   modules, fluidctl imported from the venv; then record what was installed.

A node whose wheelhouse key and wheels match its record only runs the verification (the
no-op re-run). ``inspect`` reads a node's environment for ``cluster check`` and the launchers;
``fluidctl.planning.venv`` makes a remote command use the venv's interpreter where it exists.
"""
from __future__ import annotations

import json
import os
import posixpath
import shlex
import stat
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from fluidctl import __version__
from fluidctl.remote.ssh import DEFAULT_TIMEOUT, NODE_LOST, SSHNode
from fluidctl.remote.sftp import FileToSend, SyncPlan, send_files
from fluidctl.paths import NODE_ENV_RECORD, NODE_WHEELHOUSE, node_venv
from fluidctl.cluster.wheelhouse import Wheel, Wheelhouse, pip_error

ENV_MARK = "FLUIDCTL_ENV="

# run by the venv's python on the node: imports every requirement's modules, reports versions
VERIFY = """
import importlib, importlib.metadata as md, json, sys
imports = json.loads(sys.argv[1])
for dist, modules in imports.items():
    for module in modules:
        importlib.import_module(module)
import fluidctl
print("FLUIDCTL_ENV=" + json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "python": sys.version.split()[0],
    "fluidctl": fluidctl.__version__, "fluidctl_file": fluidctl.__file__,
    "versions": {dist: md.version(dist) for dist in imports}}))
"""

# run by the venv's python for cluster check and the launchers: standard library only
INSPECT = """
import importlib.metadata as md, json, sys
try:
    record = json.load(open(sys.argv[1]))
except Exception:
    record = {}
def version(name):
    try:
        return md.version(name)
    except Exception:
        return None
print("FLUIDCTL_ENV=" + json.dumps({
    "executable": sys.executable, "python": sys.version.split()[0],
    "fluidctl": version("fluidctl"), "recorded": record.get("versions", {}),
    "versions": {name: version(name) for name in record.get("versions", {})}}))
"""


@dataclass
class NodeSetup:
    """What ``cluster setup`` did (or, with --dry-run, would do) on one node."""
    host: str
    venv: str = ""
    action: str = ""                    # create | update | ready
    push: List[Wheel] = field(default_factory=list)
    remove: List[str] = field(default_factory=list)
    install: List[str] = field(default_factory=list)    # wheel files pip installs
    ok: bool = False
    reason: str = ""
    fluidctl: str = ""
    versions: Dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def push_bytes(self) -> int:
        return sum(w.size for w in self.push)


def _marked(output: str) -> Optional[dict]:
    for line in output.splitlines():
        if line.startswith(ENV_MARK):
            return json.loads(line[len(ENV_MARK):])
    return None


def _read_record(node: SSHNode, venv: str) -> Optional[dict]:
    try:
        with node.sftp.open(posixpath.join(venv, NODE_ENV_RECORD), "r") as f:
            return json.loads(f.read().decode())
    except (OSError, ValueError):
        return None


def _write_record(node: SSHNode, venv: str, record: dict) -> None:
    path = posixpath.join(venv, NODE_ENV_RECORD)
    tmp = f"{path}.tmp-{os.getpid()}"
    with node.sftp.open(tmp, "w") as f:
        f.write(json.dumps(record, indent=1).encode())
    node.sftp.posix_rename(tmp, path)


def _exists(node: SSHNode, path: str) -> bool:
    try:
        node.sftp.stat(path)
        return True
    except OSError:
        return False


def absolute(node: SSHNode, venv: str) -> str:
    """The venv path on the node made absolute (relative ones are from the remote home)."""
    return venv if venv.startswith("/") else posixpath.join(node.sftp.normalize("."), venv)


def plan_node(node: SSHNode, house: Wheelhouse, venv_spec: str) -> tuple:
    """(NodeSetup with venv, action, push, remove and install decided; the node's record)."""
    result = NodeSetup(node.host.name)
    venv = result.venv = absolute(node, node_venv(venv_spec, node.host.name))
    wheelhouse = posixpath.join(venv, NODE_WHEELHOUSE)
    record = _read_record(node, venv) or {}
    try:
        there = {e.filename: e.st_size for e in node.sftp.listdir_attr(wheelhouse)
                 if stat.S_ISREG(e.st_mode or 0)}
    except FileNotFoundError:
        there = {}
    recorded = record.get("wheels", {})
    result.push = [w for w in house.wheels
                   if recorded.get(w.file) != w.sha256 or there.get(w.file) != w.size]
    wanted = {w.file for w in house.wheels}
    result.remove = sorted(f for f in there if f not in wanted)
    has_python = _exists(node, posixpath.join(venv, "bin", "python"))
    if not has_python:
        result.action = "create"
    elif record.get("key") != house.key or result.push:
        result.action = "update"
    else:
        result.action = "ready"
    if result.action != "ready":
        result.install = [w.file for w in house.wheels]
    return result, record


def install_script(venv: str, python: str, system_site: bool, reinstall: Sequence[str],
                   install: Sequence[str]) -> str:
    """The shell script that creates the venv if missing and installs from its wheelhouse."""
    v = shlex.quote(venv)
    py = shlex.quote(python)
    wheelhouse = shlex.quote(posixpath.join(venv, NODE_WHEELHOUSE))
    venv_args = "--system-site-packages" if system_site else ""
    lines = [
        f"if [ ! -x {v}/bin/python ]; then",
        f"  command -v {py} >/dev/null 2>&1 || {{ echo 'ERROR: python {python} not found on "
        "the node (pass --python with an interpreter there)' >&2; exit 3; }",
        # with the system's packages visible, the system's pip serves the venv: no ensurepip
        f"  if [ -n '{venv_args}' ] && {py} -m pip --version >/dev/null 2>&1; then "
        f"{py} -m venv {venv_args} --without-pip {v} || exit 3;",
        f"  else {py} -m venv {venv_args} {v} || exit 3; fi",
        "fi",
    ]
    pip = (f"{v}/bin/python -m pip install --disable-pip-version-check --no-input -q "
           f"--no-index --find-links {wheelhouse}")
    files = lambda names: " ".join(shlex.quote(posixpath.join(venv, NODE_WHEELHOUSE, n))
                                   for n in names)
    if reinstall:
        lines.append(f"{pip} --force-reinstall --no-deps {files(reinstall)} || exit 4")
    lines.append(f"{pip} {files(install)} || exit 4")
    return "\n".join(lines)


def verify_node(node: SSHNode, venv: str, house: Wheelhouse):
    """(report, '') when the venv's fluidctl runs and every requirement imports, else
    (None, the failing line)."""
    v = shlex.quote(venv)
    command = (f"{v}/bin/fluidctl --version && {v}/bin/python -c {shlex.quote(VERIFY)} "
               f"{shlex.quote(json.dumps(house.imports))}")
    result = node.run(command)
    report = _marked(result.stdout) if result.exit_code == 0 else None
    if report is None:
        return None, pip_error(result.stderr + "\n" + result.stdout)
    if not report["fluidctl_file"].startswith(report["prefix"].rstrip("/") + "/"):
        return None, (f"fluidctl is imported from {report['fluidctl_file']}, not from the "
                      f"environment {venv}")
    wrong = [f"{name} {there} there, the wheelhouse has {house.wheel(name).version}"
             for name, there in report["versions"].items()
             if house.wheel(name) and there != house.wheel(name).version]
    if wrong:
        return None, "; ".join(wrong)
    return report, ""


def _quiet(host: str, text: str) -> None:
    pass


def setup_node(node: SSHNode, house: Wheelhouse, venv_spec: str, python: str,
               system_site: bool, dry_run: bool = False, say=_quiet) -> NodeSetup:
    """Plan and (unless ``dry_run``) apply the setup of one node; ``say(host, text)`` hears
    each step as it starts."""
    started = time.monotonic()
    say(node.host.name, "reading its environment")
    result, record = plan_node(node, house, venv_spec)
    try:
        if not dry_run:
            _apply(node, house, result, record, python, system_site, say)
    finally:
        result.seconds = time.monotonic() - started
    return result


def _apply(node: SSHNode, house: Wheelhouse, result: NodeSetup, record: dict, python: str,
           system_site: bool, say=_quiet) -> None:
    from fluidctl.units import human_bytes
    venv = result.venv
    host = node.host.name
    wheelhouse = posixpath.join(venv, NODE_WHEELHOUSE)
    if result.push:
        say(host, f"pushing {len(result.push)} wheel(s) ({human_bytes(result.push_bytes)})")
        send_files(node, SyncPlan(wheelhouse, [
            FileToSend(house.path / w.file, posixpath.join(wheelhouse, w.file), w.size,
                       (house.path / w.file).stat().st_mtime, 0o644) for w in result.push]))
        digests = node.remote_sha256([posixpath.join(wheelhouse, w.file) for w in result.push])
        bad = [w.file for w in result.push
               if digests.get(posixpath.join(wheelhouse, w.file)) != w.sha256]
        if bad:
            result.reason = f"wheel(s) arrived with another sha256: {', '.join(bad)}"
            return
    for name in result.remove:
        node.sftp.remove(posixpath.join(wheelhouse, name))
    report = None
    if result.action == "ready":
        say(host, "verifying the venv")
        report, _ = verify_node(node, venv, house)
        if report is None:              # recorded as ready but broken since: install again
            result.action = "update"
            result.install = [w.file for w in house.wheels]
    if report is None:
        installed = record.get("installed", {})
        reinstall = [w.file for w in house.wheels
                     if installed.get(w.project) not in (None, w.sha256)]
        say(host, ("creating the venv, then " if result.action == "create" else "")
            + f"installing {len(result.install)} wheel(s)")
        done = node.run(install_script(venv, python, system_site, reinstall, result.install))
        if done.exit_code != 0:
            step = "venv creation" if done.exit_code == 3 else "pip install"
            result.reason = f"{step} failed: {pip_error(done.stderr + chr(10) + done.stdout)}"
            return
        say(host, "verifying the venv")
        report, why = verify_node(node, venv, house)
        if report is None:
            result.reason = f"verification failed: {why}"
            return
    result.fluidctl = report["fluidctl"]
    result.versions = report["versions"]
    if result.action != "ready" or result.remove:
        _write_record(node, venv, {
            "key": house.key, "wheels": {w.file: w.sha256 for w in house.wheels},
            "installed": {w.project: w.sha256 for w in house.wheels},
            "imports": house.imports, "versions": report["versions"],
            "fluidctl": report["fluidctl"], "python": report["python"],
            "executable": report["executable"], "time": time.time()})
    result.ok = True


# --- reading a node's environment (cluster check, launchers) --------------------------------
@dataclass
class EnvStatus:
    host: str
    present: bool = False
    executable: str = ""                # the venv's python on the node
    python: str = ""
    fluidctl: str = ""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)   # on the node
    recorded: Dict[str, str] = field(default_factory=dict)    # what setup installed
    error: str = ""

    def differences(self) -> List[str]:
        """How the node differs from this machine: fluidctl, and each requirement against the
        version installed here (else the one setup installed)."""
        if not self.present:
            return []
        import importlib.metadata       # slow to import: not on every ssh launch's way
        out = []
        if self.fluidctl != __version__:
            out.append(f"fluidctl {self.fluidctl or 'missing'} there, {__version__} here")
        for name, there in self.versions.items():
            try:
                here = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                here = self.recorded.get(name)
            if there != here:
                out.append(f"{name} {there or 'missing'} there, {here} here")
        return out


def inspect_command(venv: str) -> str:
    v = shlex.quote(venv)
    record = shlex.quote(posixpath.join(venv, NODE_ENV_RECORD))
    return (f"if [ -x {v}/bin/python ]; then {v}/bin/python -c {shlex.quote(INSPECT)} {record}; "
            f"else echo {ENV_MARK}none; fi")


def inspect(node: SSHNode, venv_spec: str, timeout: Optional[float] = None) -> EnvStatus:
    """The environment ``cluster setup`` made on a connected node (``present`` False if none)."""
    status = EnvStatus(node.host.name)
    try:
        result = node.run(inspect_command(node_venv(venv_spec, node.host.name)),
                          timeout=timeout)
    except NODE_LOST as exc:
        status.error = f"cannot read the environment: {exc}"
        return status
    line = next((l for l in result.stdout.splitlines() if l.startswith(ENV_MARK)), "")
    if line and line != ENV_MARK + "none":
        data = json.loads(line[len(ENV_MARK):])
        status.present = True
        status.executable = data["executable"]
        status.python = data["python"]
        status.fluidctl = data["fluidctl"] or ""
        status.versions = data["versions"]
        status.recorded = data["recorded"]
    elif not line:
        status.error = f"cannot read the environment: {pip_error(result.stderr)}"
    return status


def inspect_all(hosts, targets, venv_spec: str, timeout: float, progress=None,
                unreachable: Optional[dict] = None) -> Dict[str, EnvStatus]:
    """``inspect`` on every node at once; nodes that cannot be reached are left out (the
    caller's own checks name them), and put in ``unreachable`` {host: reason} if given."""
    from fluidctl.remote.ssh import connect_all, parallel
    connected = connect_all(hosts, targets, timeout=timeout, progress=progress)
    if unreachable is not None:
        unreachable.update(connected.failures)
    try:
        found = parallel(list(connected.nodes.values()),
                         lambda node: inspect(node, venv_spec, timeout))
    finally:
        connected.close()
    return {status.host: status for status in found}


def run(hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, requirements=None, python=None, venv=None,
        system_site_packages=False, no_deps=False, wheelhouse=None, dry_run=False) -> None:
    """``fluidctl cluster setup``: build the wheelhouse here once, set up every node at once,
    print a table (and with ``dry_run`` each node's steps); the exit code is the number of
    nodes that failed, each named with its reason."""
    import sys
    from pathlib import Path
    from fluidctl.cluster import wheelhouse as wheels
    from fluidctl.cluster.nodes import ordered, resolve
    from fluidctl.errors import node_failures
    from fluidctl.console import console
    from fluidctl.paths import NODE_VENV, wheelhouse_dir
    hosts, targets = resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    venv = venv or NODE_VENV
    python = python or f"python{sys.version_info[0]}.{sys.version_info[1]}"
    house = wheels.build(Path(wheelhouse) if wheelhouse else wheelhouse_dir(),
                         Path(requirements) if requirements else None, no_deps,
                         echo=console(stderr=True).print)
    results, failures = _setup_all(hosts, targets, timeout, house, venv, python,
                                   system_site_packages, dry_run)
    _print_setup(hosts, results, failures, house, python, dry_run)
    if failures:
        raise node_failures("failed the setup", ordered(failures, hosts), len(hosts),
                            exit_code=len(failures))


def _setup_all(hosts, targets, timeout, house, venv, python, system_site, dry_run):
    """``setup_node`` on every node at once: ({host: NodeSetup}, {host: reason})."""
    from fluidctl.remote import ssh
    from fluidctl.remote.progress import NodeProgress
    with NodeProgress([h.name for h in hosts], timeout=timeout) as say:
        connected = ssh.connect_all(hosts, targets, timeout=timeout, progress=say)
    failures = dict(connected.failures)

    def one(node):
        r = _one(node)
        if r.reason:
            say(r.host, f"failed: {r.reason}")
        elif dry_run:
            say(r.host, f"planned ({r.action or 'nothing'})")
        else:
            say(r.host, f"ready ({r.seconds:.1f} s)")
        return r

    def _one(node):
        try:
            return setup_node(node, house, venv, python, system_site, dry_run, say)
        except ssh.SFTPUnavailable as exc:
            return NodeSetup(node.host.name, reason=str(exc))
        except ssh.NODE_LOST as exc:
            return NodeSetup(node.host.name, reason=f"connection failed: {exc}")
    try:
        results = {r.host: r for r in ssh.parallel(list(connected.nodes.values()), one)}
    finally:
        connected.close()
    failures.update({r.host: r.reason for r in results.values() if r.reason})
    return results, failures


def _print_setup(hosts, results: dict, failures: dict, house: Wheelhouse, python: str,
                 dry_run: bool) -> None:
    """A row per node (a table on a terminal, plain columns in a pipe or a file), then with
    ``dry_run`` each node's steps on a line."""
    from fluidctl.tables import print_table
    from fluidctl.units import human_bytes
    what = "would push" if dry_run else "pushed"
    rows, details = [], []
    for host in hosts:
        r = results.get(host.name)
        if host.name in failures:       # a failed node's steps were never decided: say why
            if dry_run:
                details.append(f"{host.name}: cannot be set up: {failures[host.name]}")
            if r is None or not r.action:
                rows.append((host.name, (r.venv if r else "") or "-", "-", "-", "-", "FAIL"))
                continue
        if r is None:
            continue
        pushed = f"{len(r.push)} ({human_bytes(r.push_bytes)})" if r.push else "nothing"
        if not r.ok and r.reason:
            status = "FAIL"
        elif dry_run:
            status = "-"
        elif r.ok:
            status = f"ready fluidctl {r.fluidctl}, {r.seconds:.1f}s"
        else:
            status = "FAIL"
        rows.append((host.name, r.venv, r.action, pushed,
                     str(len(r.install)) if r.install else "-", status))
        if dry_run and host.name not in failures:
            details.append(f"{host.name}: {r.venv}: " + "; ".join(_dry_steps(r, python)))
    print_table(f"fluidctl cluster setup{' --dry-run' if dry_run else ''}: "
                f"{len(house.wheels)} wheel(s), {human_bytes(house.bytes)}",
                ("host", "venv", "action", what, "install", "status"), rows)
    if details:
        print("\n".join(details), flush=True)


def _dry_steps(r: NodeSetup, python: str) -> List[str]:
    """What ``cluster setup`` would do on one node, in words."""
    from fluidctl.units import human_bytes
    steps = [f"create the venv with {python}" if r.action == "create" else "use the venv there"]
    steps.append("push " + ", ".join(f"{w.file} ({human_bytes(w.size)})" for w in r.push)
                 if r.push else "push nothing")
    if r.remove:
        steps.append("remove " + ", ".join(r.remove))
    steps.append("install " + ", ".join(r.install) if r.install else "install nothing")
    return steps
