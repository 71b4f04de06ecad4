"""Which GPUs a node has and which of them a job uses.

GPUs are listed by ``nvidia-smi -L`` and narrowed by CUDA_VISIBLE_DEVICES (ids, GPU-UUIDs or
MIG-UUIDs, whole or a unique prefix), as CUDA itself would narrow them. A GPU split into MIG
instances is not usable whole: its instances (``MIG-<uuid>``, the lines nvidia-smi indents under
it) are the devices instead. The launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID (see envs), so the
ids here, nvidia-smi's, are CUDA's too. ``--gpus 4`` is a count (the first 4 visible), ``--gpus 0,2,3``
(or ``--gpus 3,`` for a single id) names ids.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Dict, List, Mapping, Optional, Tuple

from fluidctl.errors import UsageError

_LINE = re.compile(r"^GPU\s+(\d+):.*?(?:\(UUID:\s*(\S+?)\))?\s*$")
_MIG = re.compile(r"^MIG\b.*\(UUID:\s*(MIG-\S+?)\)\s*$")


def parse_smi(out: str) -> List[tuple]:
    """``nvidia-smi -L`` as [(gpu id, gpu uuid, [mig uuids])]."""
    found = []
    for line in out.splitlines():
        m = _LINE.match(line.strip())
        if m:
            found.append((m.group(1), m.group(2) or "", []))
            continue
        mig = _MIG.match(line.strip())
        if mig and found:
            found[-1][2].append(mig.group(1))
    return found


def _devices(gpu) -> List[str]:
    gid, _, migs = gpu
    return list(migs) if migs else [gid]


_PHYSICAL: Dict[str, str] = {}   # device entry (id, GPU- or MIG-uuid) -> nvidia-smi GPU id


def physical_gpu(device: str) -> str:
    """The physical GPU (nvidia-smi's id) of a device ``discover_gpus`` returned: a MIG
    instance's parent GPU; the device itself when unknown (e.g. found on another node)."""
    return _PHYSICAL.get(device, device)


def discover_gpus(environ: Mapping[str, str]) -> List[str]:
    """The devices this process may use, as CUDA_VISIBLE_DEVICES entries: physical GPU ids,
    or MIG-UUIDs of MIG instances (empty without nvidia-smi or GPUs)."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = parse_smi(out)
    for gid, uuid, migs in found:
        _PHYSICAL.update({d: gid for d in [gid, uuid, *migs] if d})
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [d for gpu in found for d in _devices(gpu)]
    narrowed = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        match = [gpu for gpu in found if item == gpu[0]]
        if match:
            narrowed += _devices(match[0])
            continue
        named = [d for gpu in found for d in ([gpu[1]] if gpu[1] else []) + gpu[2]
                 if d.startswith(item) and item.startswith(("GPU-", "MIG-"))]
        if len(named) != 1:
            break  # CUDA stops at the first invalid (or ambiguous) entry
        gpu = next(g for g in found if named[0] in (g[1], *g[2]))
        narrowed += [named[0]] if named[0].startswith("MIG-") else _devices(gpu)
    return narrowed


def gpu_request(spec: str) -> Tuple[int, Optional[List[str]]]:
    """A ``--gpus`` value as (how many GPUs, their ids or None for a plain count): '4' is
    (4, None), '0,2' is (2, ['0', '2']), '3,' is (1, ['3'])."""
    if spec.strip().isdigit():
        return int(spec), None
    ids = [g.strip() for g in spec.split(",") if g.strip()]
    return len(ids), ids


def select_gpus(spec: Optional[str], available: List[str]) -> List[str]:
    """Resolve a ``--gpus`` value against the available ids; None means 'all there are'."""
    if spec is None:
        return list(available)
    spec = spec.strip()
    if spec == "all":
        if not available:
            raise UsageError("--gpus all: no GPUs found on this machine (nvidia-smi -L)",
                             "use --nproc N to run N CPU processes")
        return list(available)
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
