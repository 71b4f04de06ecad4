"""Step hooks in torch and Paddle ranks that fluidctl starts but whose scripts do not import
``fluidctl.runtime``: this directory goes first on the rank's PYTHONPATH, so Python imports its
``sitecustomize.py`` at start (see there). ``rank_env`` is called where a rank's environment is
composed on its node (``procs.local.start_procs``: the local backend and every node agent;
``fluidctl worker`` under Slurm), so the path is that node's own fluidctl install."""
from __future__ import annotations

import os
from typing import Dict, Mapping

from fluidctl import envs

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
FR_ENTRIES = "64"       # torch Flight Recorder entries: the straggler report needs the newest


def wanted(env: Mapping[str, str]) -> bool:
    """Step hooks go where the launcher gave a diagnostics directory, unless switched off."""
    return bool(env.get(envs.DIAG_DIR)) and env.get(envs.STEP_HOOKS, "1") != "0"


def rank_env(env: Mapping[str, str]) -> Dict[str, str]:
    """A rank's full environment with the step hooks: this directory first on PYTHONPATH and
    TORCH_FR_BUFFER_SIZE (unless the user set it)."""
    out = dict(env)
    if not wanted(out):
        return out
    given = out.get("PYTHONPATH", "")
    # an empty entry is the working directory, kept; an empty PYTHONPATH has no entry at all
    rest = [p for p in given.split(os.pathsep) if p != DIRECTORY] if given else []
    out["PYTHONPATH"] = os.pathsep.join([DIRECTORY, *rest])
    if out.get(envs.STEP_HOOKS) != "backward":
        out.setdefault(envs.TORCH_FR_BUFFER_SIZE, FR_ENTRIES)
    return out


def install_here() -> bool:
    """For a script run inside this process (``fluidctl worker`` under mpirun): the hooks
    that sitecustomize would install at start."""
    if not wanted(os.environ):
        return False
    if os.environ.get(envs.STEP_HOOKS) != "backward":
        os.environ.setdefault(envs.TORCH_FR_BUFFER_SIZE, FR_ENTRIES)
    from fluidctl.diagnostics.inject import sitecustomize
    return sitecustomize.install()
