"""The nodes a ``cluster`` command works on: ``--hostfile``/``--hosts`` resolved through the ssh
config (``~/.ssh/config`` or ``--ssh-config``), one place for check, exec and setup."""
from __future__ import annotations


def resolve(hostfile, hosts_arg, ssh_config, accept_new_host_keys):
    """(hosts, targets): the hostfile's entries and each one's ssh target."""
    from fluidctl.planning.hosts import load_hosts
    from fluidctl.remote.sshconfig import resolve_hosts
    hosts = load_hosts(hostfile, hosts_arg)
    return resolve_hosts(hosts, ssh_config, accept_new_host_keys)


def ordered(failures: dict, hosts) -> dict:
    """``failures`` in hostfile order."""
    return {h.name: failures[h.name] for h in hosts if h.name in failures}


def progress_lines():
    """``say(host, text)``: one plain line per step per node on stderr as it happens
    ("node1: installing 2 wheel(s)"), whole lines even from many threads, in a pipe as on a
    terminal: a long step is never silent."""
    import sys
    import threading
    lock = threading.Lock()

    def say(host: str, text: str) -> None:
        line = text if text.startswith("waiting for ") else f"{host}: {text}"
        with lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    return say
