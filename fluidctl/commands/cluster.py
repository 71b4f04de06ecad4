"""``fluidctl cluster setup | check | sync | exec``: provision, look at, fill and drive the nodes
of a hostfile.

Thin commands over ``fluidctl.remote.ssh`` (and ``backends.provision`` for setup): hosts come
from ``--hostfile``/``--hosts``, SSH settings from ``~/.ssh/config`` (or ``--ssh-config``), every
node is handled in parallel, and a node that fails is named with its reason; the exit code is 1
if any node failed (setup: the number of nodes that failed).

paramiko (a quarter of a second to import) is imported inside the commands that use it:
``sync`` goes through OpenSSH (``fluidctl.remote.push``) and needs it only to fall back to SFTP.
"""
from __future__ import annotations

import functools
import signal
import threading
from pathlib import Path

import click

from fluidctl.commands.numbers import seconds
from fluidctl.console import console
from fluidctl.cluster.sync import DEFAULT_TIMEOUT as SSH_TIMEOUT, fail_nodes
from fluidctl.planning.hosts import load_hosts
from fluidctl.units import human_bytes


def host_options(fn):
    """--hostfile/--hosts, --ssh-config, --timeout, --accept-new-host-keys: every subcommand."""
    options = [
        click.option("--hostfile", type=click.Path(dir_okay=False),
                     help="Nodes, one per line: 'node1 slots=4', 'node1:4', 'user@node1' "
                          "(e.g. --hostfile hosts.txt)."),
        click.option("--hosts", "hosts_arg", metavar="LIST",
                     help="Nodes on the command line instead (e.g. --hosts node1:2,node2:2)."),
        click.option("--ssh-config", type=click.Path(dir_okay=False),
                     help="ssh config for Host aliases, ports, users and keys "
                          "(default ~/.ssh/config; e.g. --ssh-config cluster.conf)."),
        click.option("--timeout", type=seconds(0.1, 86400, "--timeout 30"), default=SSH_TIMEOUT,
                     show_default=True,
                     help="Seconds to wait for each node (e.g. --timeout 30)."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record host keys not yet in known_hosts (like ssh "
                          "-o StrictHostKeyChecking=accept-new); changed keys are still refused."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _resolve(hostfile, hosts_arg, ssh_config, accept_new):
    from fluidctl.remote.sshconfig import resolve_hosts
    hosts = load_hosts(hostfile, hosts_arg)
    return resolve_hosts(hosts, ssh_config, accept_new)


@click.group(help="""Provision, check, fill and drive the nodes of a hostfile over SSH.

\b
Examples:
  fluidctl cluster setup --hostfile hosts.txt --requirements requirements.txt
  fluidctl cluster check --hostfile hosts.txt
  fluidctl cluster sync --hostfile hosts.txt --exclude '*.ckpt' .
  fluidctl cluster exec --hosts node1,node2 -- nvidia-smi -L""")
def cluster():
    pass


@cluster.command(help="""Check every node in parallel: reachable, authenticated, Python and
fluidctl there (same version as here), free disk, GPUs, and the CuPy / NCCL versions a GPU
rank would get there ("CuPy 14.2.0, NCCL 2.32.3, no usable GPU"). Exit 1 naming each failing
node.

\b
Example:
  fluidctl cluster check --hostfile hosts.txt --timeout 5""")
@host_options
@click.option("--python", "python", metavar="PATH",
              help="Interpreter to check on the nodes (default: this one's path, "
                   "e.g. --python /usr/bin/python3).")
@click.option("--remote-dir", metavar="DIR",
              help="Directory whose free space to report, which must exist "
                   "(default: the remote home; e.g. --remote-dir /data/job).")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="The environment 'fluidctl cluster setup' made on the nodes ('{host}' is "
                   "the node's name; default: $FLUIDCTL_VENV, else ~/.fluidctl/venv). Where it "
                   "exists, its python is checked and its versions compared with this machine's.")
def check(hostfile, hosts_arg, ssh_config, timeout, accept_new_host_keys, python, remote_dir,
          venv):
    from fluidctl.cluster import setup as provision
    from fluidctl.cluster.check import check_nodes
    from fluidctl.paths import NODE_VENV
    from rich.table import Table
    hosts, targets = _resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    envs = provision.inspect_all(hosts, targets, venv or NODE_VENV, timeout)
    groups: dict = {}           # interpreter -> hosts checked with it (a node's venv python)
    for host in hosts:
        env = envs.get(host.name)
        chosen = python or (env.executable if env and env.present else None)
        groups.setdefault(chosen, []).append(host)
    found = {}
    for chosen, members in groups.items():
        for r in check_nodes(members, targets=targets, timeout=timeout, python=chosen,
                             remote_dir=remote_dir):
            found[r.host] = r
    results = [found[h.name] for h in hosts]
    for r in results:
        env = envs.get(r.host)
        drift = env.differences() if env else []
        if drift:
            r.ok = False
            r.reason = "; ".join([*([r.reason] if r.reason else []), ", ".join(drift)
                                  + " (run fluidctl cluster setup)"])
    table = Table(title=f"fluidctl cluster check: {len(hosts)} node(s)")
    for column in ("host", "address", "status", "env", "python", "fluidctl", "free disk",
                   "gpus", "CuPy / NCCL", "seconds", "reason"):
        table.add_column(column, overflow="fold")
    for r in results:
        status = "[green]ok[/]" if r.ok else "[bold red]FAIL[/]"
        env = envs.get(r.host)
        state = "-" if env is None or not env.present else \
            ("differs" if env.differences() else "ok")
        table.add_row(r.host, r.address, status, state, r.python or "-", r.fluidctl or "-",
                      human_bytes(r.disk_free), "-" if r.gpus is None else str(r.gpus),
                      r.gpu_stack or "-", f"{r.seconds:.2f}", r.reason)
    console().print(table)
    failures = {r.host: r.reason for r in results if not r.ok}
    if failures:
        raise fail_nodes("failed the check", failures, len(results))


@cluster.command(name="exec", help="""Run a command on every node at once; each output line is
prefixed with its host. Exit 1 if the command failed (or could not run) on any node.

\b
Examples:
  fluidctl cluster exec --hostfile hosts.txt -- nvidia-smi -L
  fluidctl cluster exec --hosts node1,node2 -- 'df -h $HOME'""")
@host_options
@click.option("--remote-dir", metavar="DIR",
              help="Run the command in this directory (e.g. --remote-dir /data/job).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(hostfile, hosts_arg, ssh_config, timeout, accept_new_host_keys, remote_dir, command):
    from rich.text import Text
    from fluidctl.remote import ssh
    from fluidctl.remote.sshlib import paramiko
    hosts, targets = _resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    text = " ".join(command)       # as ssh does: the remote shell sees the words joined
    out, err = console(), console(stderr=True)
    lock = threading.Lock()
    width = max(len(h.name) for h in hosts)

    def on_line(host, stream, line):
        with lock:
            (err if stream == "stderr" else out).print(
                Text.assemble((f"[{host:<{width}}] ", "cyan"), line), soft_wrap=True)

    connected = ssh.connect_all(hosts, targets, timeout=timeout)
    failures = dict(connected.failures)
    procs = {}
    try:
        for name, node in connected.nodes.items():      # output streams from reader threads
            try:
                procs[name] = node.start(text, cwd=remote_dir,
                                         on_line=functools.partial(on_line, name))
            except (ssh.ConnectionLost, paramiko.SSHException, OSError) as exc:
                failures[name] = f"cannot start the command: {exc}"
        for name, proc in procs.items():
            try:
                code = proc.wait()
            except ssh.ConnectionLost as exc:
                failures[name] = str(exc)
                continue
            if code == 97 and remote_dir:
                failures[name] = f"cannot cd to {remote_dir}"
            elif code != 0:
                failures[name] = f"exit code {code}"
    except KeyboardInterrupt:       # Ctrl-C: stop the command on every node, leave nothing
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        raise click.Abort() from None
    finally:
        connected.close()
    if failures:
        ordered = {h.name: failures[h.name] for h in hosts if h.name in failures}
        raise fail_nodes("failed", ordered, len(hosts))


@cluster.command(help="""Push a directory (or one file) to every node at once, sending only
files whose size or modification time differ (--checksum: whose content differs). Each node gets
one OpenSSH connection (the same ssh config as your ssh) and needs only python3: the file list
goes in one round trip and the files in one stream; each is written under a temporary name
and renamed into place, keeping its mode and mtime. Without an ssh client here or python3
there, the node is synced over SFTP instead.

\b
Examples:
  fluidctl cluster sync --hostfile hosts.txt .
  fluidctl cluster sync --hostfile hosts.txt --remote-dir /data/job --exclude '*.ckpt' src/""")
@host_options
@click.option("--remote-dir", metavar="DIR",
              help="Where the files go on each node; '{host}' is replaced by the node's name "
                   "(default: the same absolute path as here; e.g. --remote-dir /data/job).")
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Skip files or directories matching a glob, repeatable (e.g. --exclude "
                   "'*.ckpt' --exclude data/raw); .git, __pycache__ and *.pyc are always skipped.")
@click.option("--checksum", is_flag=True,
              help="Compare content (sha256) instead of size and mtime (e.g. after a checkout "
                   "that reset mtimes).")
@click.argument("src", default=".", type=click.Path(exists=True))
def sync(**params):
    from fluidctl.cluster.sync import run
    run(**params)


@cluster.command(help="""Make a ready Python environment on every node: build a wheelhouse here
once (fluidctl from this checkout or its installed version, the requirements and what they
depend on), push to each node only the wheels it lacks (by sha256, all nodes at once), create or
update a venv there with pip install --no-index --find-links, and verify it (fluidctl --version,
python -c "import ..." per requirement). A second run on a ready cluster changes nothing.
train --hostfile and cluster check then use that venv on the nodes. Exit code: how many nodes
failed (each named with pip's own error line); the others are still set up.

\b
Examples:
  fluidctl cluster setup --hostfile hosts.txt --requirements requirements.txt
  fluidctl cluster setup --hostfile hosts.txt --python python3.11 --venv /opt/job-env
  fluidctl cluster setup --hostfile hosts.txt -r requirements.txt --dry-run""")
@host_options
@click.option("-r", "--requirements", type=click.Path(dir_okay=False),
              help="pip requirements file to install on every node besides fluidctl "
                   "(e.g. --requirements requirements.txt).")
@click.option("--python", "python", metavar="PYTHON", default=None,
              help="Interpreter on the nodes that creates the venv (default: this one's "
                   "version, e.g. python3.11; e.g. --python /usr/bin/python3).")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="The venv on the nodes; '{host}' is replaced by the node's name, relative "
                   "paths are from the remote home (default: $FLUIDCTL_VENV, else "
                   "~/.fluidctl/venv; e.g. --venv /opt/job-env).")
@click.option("--system-site-packages", is_flag=True,
              help="Let the venv see the node Python's own packages (e.g. a CUDA build of "
                   "torch installed there), as python -m venv --system-site-packages.")
@click.option("--no-deps", is_flag=True,
              help="Put only fluidctl and the listed requirements in the wheelhouse, not their "
                   "dependencies (for nodes that have them; pair with --system-site-packages).")
@click.option("--wheelhouse", type=click.Path(file_okay=False), default=None,
              help="Where the wheelhouse is built here (default: ~/.cache/fluidctl/wheelhouse; "
                   "e.g. --wheelhouse ./wheels).")
@click.option("--dry-run", is_flag=True,
              help="Build the wheelhouse here, then print per node what would be pushed and "
                   "installed; change nothing on the nodes.")
def setup(hostfile, hosts_arg, ssh_config, timeout, accept_new_host_keys, requirements, python,
          venv, system_site_packages, no_deps, wheelhouse, dry_run):
    import sys
    from rich.table import Table
    from fluidctl.cluster import wheelhouse as wheels
    from fluidctl.cluster import setup as provision
    from fluidctl.remote import ssh
    from fluidctl.remote.sshlib import paramiko
    from fluidctl.paths import NODE_VENV, wheelhouse_dir
    hosts, targets = _resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    venv = venv or NODE_VENV
    python = python or f"python{sys.version_info[0]}.{sys.version_info[1]}"
    err = console(stderr=True)
    house = wheels.build(Path(wheelhouse) if wheelhouse else wheelhouse_dir(),
                         Path(requirements) if requirements else None, no_deps,
                         echo=err.print)
    connected = ssh.connect_all(hosts, targets, timeout=timeout)
    failures = dict(connected.failures)

    def one(node):
        try:
            return provision.setup_node(node, house, venv, python, system_site_packages,
                                        dry_run)
        except (OSError, ssh.ConnectionLost, paramiko.SSHException) as exc:
            return provision.NodeSetup(node.host.name, reason=f"connection failed: {exc}")
    try:
        results = {r.host: r for r in ssh.parallel(list(connected.nodes.values()), one)}
    finally:
        connected.close()
    for r in results.values():
        if r.reason:
            failures[r.host] = r.reason
    what = "would push" if dry_run else "pushed"
    table = Table(title=f"fluidctl cluster setup{' --dry-run' if dry_run else ''}: "
                        f"{len(house.wheels)} wheel(s), {human_bytes(house.bytes)}")
    for column in ("host", "venv", "action", what, "install", "status"):
        table.add_column(column, overflow="fold")
    details = []
    for host in hosts:
        r = results.get(host.name)
        if r is None:
            continue
        pushed = f"{len(r.push)} ({human_bytes(r.push_bytes)})" if r.push else "nothing"
        if dry_run:
            status = "-"
        elif r.ok:
            status = f"[green]ready[/] fluidctl {r.fluidctl}, {r.seconds:.1f}s"
        else:
            status = "[bold red]FAIL[/]"
        table.add_row(host.name, r.venv, r.action, pushed, str(len(r.install)) if r.install
                      else "-", status)
        if dry_run:
            steps = [f"create the venv with {python}" if r.action == "create" else
                     "use the venv there"]
            steps.append("push " + ", ".join(f"{w.file} ({human_bytes(w.size)})" for w in r.push)
                         if r.push else "push nothing")
            if r.remove:
                steps.append("remove " + ", ".join(r.remove))
            steps.append("install " + ", ".join(r.install) if r.install else "install nothing")
            details.append(f"{host.name}: {r.venv}: " + "; ".join(steps))
    out = console()
    out.print(table)
    for line in details:
        out.print(line, soft_wrap=True, markup=False)
    if failures:
        ordered = {h.name: failures[h.name] for h in hosts if h.name in failures}
        error = fail_nodes("failed the setup", ordered, len(hosts))
        error.exit_code = len(ordered)
        raise error
