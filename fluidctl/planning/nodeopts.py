"""The options of ``fluidctl train`` that only mean something for a job on the nodes of
--hostfile/--hosts (how fluidctl reaches them over SSH and what it finds there): a backend that
runs without such nodes refuses them in one line instead of dropping them (each backend's
``configure`` asks, naming what it keeps)."""
from __future__ import annotations

import os
from typing import Collection

from fluidctl import envs
from fluidctl.errors import UsageError


def given(config, include_bad: bool = False) -> dict:
    """{flag: dest} of the node options set in ``config`` to more than their defaults (--venv
    from $FLUIDCTL_VENV counts as not given: every command reads it)."""
    found = {"--ssh-config": config.ssh_config, "--accept-new-host-keys":
             config.accept_new_host_keys, "--remote-dir": config.remote_dir,
             "--ssh-timeout": config.ssh_timeout != type(config).ssh_timeout,
             "--venv": config.venv and config.venv != os.environ.get(envs.VENV),
             "--include-bad": include_bad}
    return {flag: value for flag, value in found.items() if value}


def refuse_without_nodes(config, include_bad: bool, where: str,
                         keep: Collection[str] = ()) -> None:
    """One line for the first node option given to a job that has no such nodes (``where``:
    how the backend says where its job runs); ``keep``: the flags it gives a meaning."""
    for flag in given(config, include_bad):
        if flag not in keep:
            raise UsageError(f"{flag} is for jobs on --hostfile/--hosts nodes, and {where}",
                             f"drop {flag}")
