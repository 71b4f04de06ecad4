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

from fluidctl.errors import node_failures

DEFAULT_TIMEOUT = 10.0      # fluidctl.remote.ssh.DEFAULT_TIMEOUT (tests check they agree)


def run(hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, remote_dir=None, excludes=(), checksum=False,
        src=".") -> None:
    """Push ``src`` to every node at once (see ``fluidctl cluster sync --help``)."""
    from fluidctl.remote import push, sshargv
    from fluidctl.planning.hosts import load_hosts
    source = os.path.realpath(src)
    default_dir = source if os.path.isdir(source) else os.path.dirname(source)
    hosts = load_hosts(hostfile, hosts_arg)
    argvs = [sshargv.ssh_command(h.name, user=h.user, port=h.port, ssh_config=ssh_config,
                              accept_new=accept_new_host_keys, timeout=timeout) for h in hosts]
    argvs = dict(zip((h.name for h in hosts), sshargv.with_fast_cipher(argvs)))
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
    from fluidctl.remote.progress import NodeProgress
    progress = NodeProgress(argvs, timeout=timeout, totals={h.name: total for h in hosts})
    outcomes = {}
    vanished = set()

    def one(host):
        where = (remote_dir or default_dir).replace("{host}", host.name)
        if host.name in channels:
            try:
                result = push.push(argvs[host.name], files, where, compare,
                                   progress.advancer(host.name), channel=channels[host.name],
                                   on_answer=lambda n, size: progress.say(
                                       host.name, _to_send(n, size, len(files))))
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
                                         accept_new_host_keys, timeout, progress, vanished)

    def worker(host, finished):
        try:
            one(host)
            outcome = outcomes.get(host.name)
            progress.say(host.name, f"failed: {outcome}" if isinstance(outcome, str) else
                         f"synced ({progress.elapsed()})")
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
        raise node_failures("failed to sync", failures, len(hosts), exit_code=1)


def _to_send(count: int, size: int, listed: int) -> str:
    """A node's answer: what it lacks of the ``listed`` files."""
    if not count:
        return f"up to date ({listed} file(s))"
    from fluidctl.units import human_bytes
    return f"sending {count} of {listed} file(s) ({human_bytes(size)})"


def _warn(text: str) -> None:
    import sys
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _sync_sftp(host, source, where, excludes, compare, ssh_config, accept_new, timeout,
               progress, vanished):
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
        progress.say(host.name, _to_send(len(plan.send), plan.bytes, len(plan.send) +
                                         plan.unchanged) + " over SFTP")
        try:
            send_files(node, plan, progress.advancer(host.name))
        except ssh.NODE_LOST as exc:
            return f"copy failed: {exc}"
        source_dir = source if os.path.isdir(source) else os.path.dirname(source)
        vanished.update(os.path.relpath(p, source_dir) for p in plan.vanished)
        return (where, len(plan.send) - len(plan.vanished),
                plan.bytes - sum(f.size for f in plan.send if str(f.local) in plan.vanished),
                plan.unchanged)
    finally:
        connected.close()
