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

