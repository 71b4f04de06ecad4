"""Which GPUs a node has and which of them a job uses.

GPUs are listed by ``nvidia-smi -L`` and narrowed by CUDA_VISIBLE_DEVICES (ids or GPU-UUIDs),
as CUDA itself would narrow them. ``--gpus 4`` is a count (the first 4 visible), ``--gpus 0,2,3``
(or ``--gpus 3,`` for a single id) names ids.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import List, Mapping, Optional

from fluidctl.errors import UsageError

_LINE = re.compile(r"^GPU\s+(\d+):.*?(?:\(UUID:\s*(\S+?)\))?\s*$")


def discover_gpus(environ: Mapping[str, str]) -> List[str]:
    """Physical ids of the GPUs this process may use (empty without nvidia-smi or GPUs)."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []  # (id, uuid)
    for line in out.splitlines():
        m = _LINE.match(line.strip())
        if m:
            found.append((m.group(1), m.group(2) or ""))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [gid for gid, _ in found]
    by_uuid = {uuid: gid for gid, uuid in found if uuid}
    ids = {gid for gid, _ in found}
    narrowed = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        gid = item if item in ids else by_uuid.get(item)
        if gid is None:
            break  # CUDA stops at the first invalid entry
        narrowed.append(gid)
    return narrowed


def select_gpus(spec: Optional[str], available: List[str]) -> List[str]:
    """Resolve a ``--gpus`` value against the available ids; None means 'all there are'."""
    if spec is None:
        return list(available)
    spec = spec.strip()
    if re.fullmatch(r"\d+", spec):
        count = int(spec)
        if count <= 0:
            raise UsageError(f"--gpus {spec} asks for no GPUs",
                             "give a count >= 1, ids like 0,2,3, or use --nproc N for CPU processes")
        if not available:
            raise UsageError(f"--gpus {spec}: no GPUs found on this machine (nvidia-smi -L)",
                             "use --nproc N to run N CPU processes")
        if count > len(available):
            raise UsageError(f"--gpus {spec}: only {len(available)} GPU(s) visible "
                             f"({','.join(available)})",
                             f"use --gpus {len(available)} or fewer, or --nproc N on CPU")
        return available[:count]
    if not re.fullmatch(r"\d+(,\d+)*,?", spec):
        raise UsageError(f"malformed --gpus {spec!r}",
                         "give a count (--gpus 4) or comma-separated ids (--gpus 0,2,3)")
    wanted = [s for s in spec.split(",") if s]
    if len(set(wanted)) != len(wanted):
        raise UsageError(f"--gpus {spec} names a GPU twice", "list each id once")
    if not available:
        raise UsageError(f"--gpus {spec}: no GPUs found on this machine (nvidia-smi -L)",
                         "use --nproc N to run N CPU processes")
    unknown = [g for g in wanted if g not in available]
    if unknown:
        raise UsageError(f"--gpus {spec}: unknown GPU id {','.join(unknown)} "
                         f"(visible: {','.join(available)})",
                         "pick ids from 'nvidia-smi -L', or use --nproc N on CPU")
    return wanted
