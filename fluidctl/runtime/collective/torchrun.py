"""A fluidctl.runtime job started by torchrun instead of ``fluidctl train``.

torchrun gives each rank RANK, WORLD_SIZE and MASTER_ADDR:MASTER_PORT, where its agent already
serves a TCPStore (torch's own rendezvous; TORCHELASTIC_USE_AGENT_STORE), and no
FLUIDCTL_JOB_TOKEN. So:

- fluidctl's store does not take MASTER_PORT: rank 0 serves it on a free port of its own
  address and publishes that endpoint in torchrun's store; every rank reads it there.
- The job token: FLUIDCTL_JOB_TOKEN when the user exported one (the same on every rank), else
  rank 0 makes a random one and hands it over through torchrun's store. That store has no
  authentication: whoever can reach it can already take over torch's own rendezvous, so the
  token is as safe as the torchrun job itself, no less (as under a bare mpirun, where MPI hands
  it over). Export FLUIDCTL_JOB_TOKEN where that is not enough.

Keys are under the run id and restart count, so a restarted torchrun attempt never reads the
previous attempt's endpoint.
"""
from __future__ import annotations

import os
import secrets
import socket
from typing import Mapping

from fluidctl import envs
from fluidctl.net import free_port

RUN_ID = "TORCHELASTIC_RUN_ID"          # torchrun sets it in every worker; fluidctl train never


def started_by_torchrun(environ: Mapping[str, str]) -> bool:
    """torchrun's worker environment, not fluidctl's contract (which names PADDLE_MASTER)."""
    return bool(environ.get(RUN_ID)) and not environ.get(envs.MASTER)


def _own_address(master_host: str) -> str:
    """The address of this host that reaches ``master_host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((socket.gethostbyname(master_host), 9))
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def adopt(env: envs.DistEnv, environ: Mapping[str, str], timeout: float) -> envs.DistEnv:
    """``env`` with fluidctl's store endpoint (and a token, unless one was given) agreed
    through torchrun's agent store at MASTER_ADDR:MASTER_PORT."""
    from datetime import timedelta
    from torch.distributed import TCPStore
    host = environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(environ.get("MASTER_PORT", "0"))
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
    prefix = f"fluidctl/{environ.get(RUN_ID)}/{environ.get(envs.TORCH_RESTART_COUNT, '0')}/"
    if env.rank == 0:
        mine = _own_address(host)
        store.set(prefix + "master", f"{mine}:{free_port(mine)}")
        if not env.token:
            store.set(prefix + "token", secrets.token_hex(16))
    master = store.get(prefix + "master").decode()
    token = env.token or store.get(prefix + "token").decode()
    return env._replace(master=master, token=token)
