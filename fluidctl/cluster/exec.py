"""``fluidctl cluster exec``: one command on every node at once, each output line prefixed with
its host; Ctrl-C stops it on every node."""
from __future__ import annotations

import functools
import signal
import threading

from fluidctl.remote.ssh import DEFAULT_TIMEOUT


def run(command, hostfile=None, hosts_arg=None, ssh_config=None, timeout=DEFAULT_TIMEOUT,
        accept_new_host_keys=False, remote_dir=None, venv=None) -> None:
    """Run ``command`` (see ``command_line``) on every node, with the node's
    ``cluster setup`` venv first on PATH where it exists (so what setup installed is what the
    command finds); exit 1 naming each node where it failed or could not run."""
    from fluidctl.paths import NODE_VENV
    from fluidctl.planning.venv import activate
    from rich.text import Text
    from fluidctl.cluster.nodes import ordered, resolve
    from fluidctl.errors import node_failures
    from fluidctl.console import console
    from fluidctl.remote import ssh
    hosts, targets = resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys)
    out, err = console(), console(stderr=True)
    lock = threading.Lock()
    width = max(len(h.name) for h in hosts)

    def on_line(host, stream, line):
        with lock:
            (err if stream == "stderr" else out).print(
                Text.assemble((f"[{host:<{width}}] ", "cyan"), line), soft_wrap=True)

    from fluidctl.remote.progress import NodeProgress
    with NodeProgress([h.name for h in hosts], timeout=timeout) as waits:
        connected = ssh.connect_all(hosts, targets, timeout=timeout, progress=waits.answered)
    failures = dict(connected.failures)
    try:
        text = command_line(command)
        failures.update(_run_on(connected.nodes, {
            name: activate(text, venv or NODE_VENV, name) for name in connected.nodes},
            remote_dir, on_line))
    finally:
        connected.close()
    if failures:
        raise node_failures("failed", ordered(failures, hosts), len(hosts), exit_code=1)


def command_line(command) -> str:
    """The shell line a node runs: one word is a shell line as typed (``-- 'df -h $HOME'``);
    several are quoted one by one, so each reaches the program whole, as typed
    (``-- python -c "import tqdm"``). ssh's own re-joining with spaces would split them."""
    import shlex
    words = list(command)
    return words[0] if len(words) == 1 else shlex.join(words)


def _run_on(nodes: dict, texts: dict, remote_dir, on_line) -> dict:
    """Start ``texts[name]`` on every connected node, wait for each; {host: reason} where it failed.
    On Ctrl-C every node's command gets SIGTERM before KeyboardInterrupt goes on."""
    from fluidctl.remote import ssh
    failures, procs = {}, {}
    try:
        for name, node in nodes.items():        # output streams from reader threads
            try:
                procs[name] = node.start(texts[name], cwd=remote_dir,
                                         on_line=functools.partial(on_line, name))
            except ssh.NODE_LOST as exc:
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
    except KeyboardInterrupt:   # stop the command on every node, leave nothing behind
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        raise
    return failures
