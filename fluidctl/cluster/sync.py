"""What ``fluidctl cluster sync`` does, without click.

``cluster sync`` is a dev-loop command (edit, sync, run) whose whole run is often a few hundred
milliseconds, most of it the nodes' ssh handshakes: every millisecond before the first ``ssh``
starts is added to it. ``fluidctl.cli.main`` therefore parses its plain forms with
``fluidctl.fastargs`` and calls ``run`` directly; the click command in ``commands/cluster.py``
(``--help``, odd forms, click's own messages) calls the same ``run``. Nothing here imports
click, rich (only on a terminal, for the progress bars) or paramiko (only for the SFTP
fallback), and the ssh processes start before the local tree is listed.
"""
from __future__ import annotations

import _thread       # not threading: its imports (functools, collections) would delay the ssh
import os

from fluidctl.errors import FluidctlError

DEFAULT_TIMEOUT = 10.0      # fluidctl.remote.ssh.DEFAULT_TIMEOUT (tests check they agree)


def fail_nodes(what: str, failures: dict, total: int) -> FluidctlError:
    """``N of M node(s) <what>: host: reason; ...``, exit code 1."""
    names = "; ".join(f"{host}: {reason}" for host, reason in failures.items())
    return FluidctlError(f"{len(failures)} of {total} node(s) {what}: {names}", exit_code=1)


def run(hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, remote_dir=None, excludes=(), checksum=False,
        src=".") -> None:
    """Push ``src`` to every node at once (see ``fluidctl cluster sync --help``)."""
    from fluidctl.remote import push
    from fluidctl.planning.hosts import load_hosts
    source = os.path.realpath(src)
    default_dir = source if os.path.isdir(source) else os.path.dirname(source)
    hosts = load_hosts(hostfile, hosts_arg)
    argvs = [push.ssh_command(h.name, user=h.user, port=h.port, ssh_config=ssh_config,
                              accept_new=accept_new_host_keys, timeout=timeout) for h in hosts]
    argvs = dict(zip((h.name for h in hosts), push.with_fast_cipher(argvs)))
    # every node's ssh handshake and python3 start while the files are listed here
    try:
        channels = dict(zip(argvs, push.connect_all(list(argvs.values()))))
    except push.PushUnavailable:            # no ssh client here: every node over SFTP
        channels = {}
    from fluidctl.remote.sftp import DEFAULT_EXCLUDES, walk
    try:
        files = push.scan(walk(source, (*DEFAULT_EXCLUDES, *excludes), warn=_warn))
    except BaseException:
        for channel in channels.values():
            channel.kill()
        raise
    compare = "hash" if checksum else "mtime"
    total = files.total_bytes()
    progress = _SyncProgress({h.name: total for h in hosts})
    outcomes = {}
    vanished = set()

    def one(host):
        where = (remote_dir or default_dir).replace("{host}", host.name)
        if host.name in channels:
            try:
                result = push.push(argvs[host.name], files, where, compare,
                                   progress.advancer(host.name), channel=channels[host.name])
                outcomes[host.name] = (where, len(result.sent), result.sent_bytes,
                                       result.unchanged)
                vanished.update(result.vanished)
                return
            except push.PushFailed as exc:
                outcomes[host.name] = str(exc)
                return
            except push.PushUnavailable:
                pass                        # over SFTP, below
            except OSError as exc:          # a local file unreadable, say
                outcomes[host.name] = f"{exc.filename or 'copy'}: {exc.strerror or exc}"
                return
        outcomes[host.name] = _sync_sftp(host, source, where, excludes, compare, ssh_config,
                                         accept_new_host_keys, timeout,
                                         progress.advancer(host.name), vanished)

    def worker(host, finished):
        try:
            one(host)
        finally:
            finished.release()

    with progress:
        running = []
        for host in hosts:                  # one thread per node; a lock each, to join on
            finished = _thread.allocate_lock()
            finished.acquire()
            _thread.start_new_thread(worker, (host, finished))
            running.append(finished)
        for finished in running:
            finished.acquire()
    for rel in sorted(vanished):
        _warn(f"{rel} vanished during the sync: not sent")
    outcomes = {h.name: outcomes.get(h.name, "no result (internal error)") for h in hosts}
    failures = {name: o for name, o in outcomes.items() if isinstance(o, str)}
    from fluidctl.tables import print_table
    from fluidctl.units import human_bytes
    rows = [(name, o[0], str(o[1]), human_bytes(o[2]), str(o[3]))
            for name, o in outcomes.items() if not isinstance(o, str)]
    print_table(f"fluidctl cluster sync: {source}",
                ("host", "remote dir", "sent files", "sent", "unchanged"), rows)
    if failures:
        raise fail_nodes("failed to sync", failures, len(hosts))


class _SyncProgress:
    """One rich bar per node, drawn only on a terminal (rich is imported only then)."""

    def __init__(self, totals: dict):
        import sys
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TransferSpeedColumn)
            from fluidctl.console import console
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), console=console(stderr=True),
                                transient=True)
            self.tasks = {name: self.bar.add_task(name, total=total or 1)
                          for name, total in totals.items()}

    def advancer(self, name: str):
        if self.bar is None:
            return None
        return lambda n: self.bar.advance(self.tasks[name], n)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _warn(text: str) -> None:
    import sys
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _sync_sftp(host, source, where, excludes, compare, ssh_config, accept_new, timeout,
               on_bytes, vanished):
    """The fallback: paramiko + SFTP (no ssh client here, or no python3 on the node); returns
    (remote dir, files sent, bytes sent, unchanged) or the reason it failed."""
    from pathlib import Path
    from fluidctl.remote import ssh
    from fluidctl.remote.sshconfig import resolve_hosts
    from fluidctl.remote.sftp import DEFAULT_EXCLUDES, plan_sync, send_files
    resolved, targets = resolve_hosts([host], ssh_config, accept_new)
    connected = ssh.connect_all(resolved, targets, timeout=timeout)
    try:
        if connected.failures:
            return connected.failures[host.name]
        node = connected.nodes[host.name]
        try:
            plan = plan_sync(node, Path(source), where, (*DEFAULT_EXCLUDES, *excludes), compare)
        except ssh.NODE_LOST as exc:
            return f"cannot list {where}: {exc}"
        try:
            send_files(node, plan, on_bytes)
        except ssh.NODE_LOST as exc:
            return f"copy failed: {exc}"
        source_dir = source if os.path.isdir(source) else os.path.dirname(source)
        vanished.update(os.path.relpath(p, source_dir) for p in plan.vanished)
        return (where, len(plan.send) - len(plan.vanished),
                plan.bytes - sum(f.size for f in plan.send if str(f.local) in plan.vanished),
                plan.unchanged)
    finally:
        connected.close()
