"""A pserver's shard on disk: one raw data file plus a JSON manifest (never pickle).

Layout under ``--checkpoint-dir D``, one sub-directory per pserver id::

    D/pserver.0/manifest.json        step, optimizer config, table metas, and for every
                                     array: name, dtype, shape, offset, nbytes, crc32
    D/pserver.0/shard-<step>.bin     the arrays' bytes, back to back
    D/pserver.0/lock                 flock'ed while a server uses the directory

Writing is atomic: the data file and the manifest are written under temporary names, fsynced
and renamed; the manifest's rename is the commit point, then older data files are removed. A
crash at any moment leaves the previous checkpoint loadable.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
import zlib
from pathlib import Path
from typing import Dict, Optional

import numpy as np

import fluidctl.runtime.optim as optim
from fluidctl.paths import write_atomic
from fluidctl.runtime.pserver.protocol import BadRequest, safe_dtype, safe_shape
from fluidctl.runtime.pserver.shard import ShardState
from fluidctl.runtime.pserver.sparse import SparseTable

FORMAT = 1
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    pass


def shard_dir(root, pserver_id: int) -> Path:
    return Path(root) / f"pserver.{pserver_id}"


def lock_dir(path: Path):
    """Hold an exclusive lock on the shard directory for the life of the server: two pservers
    with the same id and directory would overwrite each other's checkpoints."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CheckpointError(f"{path} is in use by another pserver") from None
    return fd


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _collect(state: ShardState) -> Dict[str, np.ndarray]:
    arrays: Dict[str, np.ndarray] = {f"dense/{k}": v for k, v in state.dense.items()}
    if state.opt is not None:
        arrays.update({f"opt/{k}": np.asarray(v) for k, v in state.opt.state_arrays().items()
                       if not k.startswith("sparse/")})
    for name, table in state.sparse.items():
        arrays.update({f"sparse/{name}/{k}": v for k, v in table.arrays().items()})
    return arrays


def save(state: ShardState, directory: Path) -> Path:
    """Write ``state`` (call with ``state.cond`` held so it is one consistent step)."""
    directory.mkdir(parents=True, exist_ok=True)
    step = state.step
    data_name = f"shard-{step:010d}.bin"
    tmp_data = directory / f".{data_name}.tmp"
    tmp_manifest = directory / f".{MANIFEST}.tmp"
    try:
        return _write(state, directory, step, data_name, tmp_data, tmp_manifest)
    except BaseException:
        # a failed save (a full disk) leaves nothing behind: its partial files would keep
        # the disk full and every later checkpoint failing; the previous one stays loadable
        for tmp in (tmp_data, tmp_manifest):
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        if _committed_data(directory) != data_name:     # renamed, but its manifest never was
            try:
                (directory / data_name).unlink(missing_ok=True)
            except OSError:
                pass
        raise


def _committed_data(directory: Path) -> Optional[str]:
    try:
        return json.loads((directory / MANIFEST).read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        return None


def _write(state: ShardState, directory: Path, step: int, data_name: str, tmp_data: Path,
           tmp_manifest: Path) -> Path:
    entries, offset = [], 0
    with open(tmp_data, "wb") as f:
        for name, arr in _collect(state).items():
            arr = arr if arr.flags.c_contiguous else arr.copy()   # (keeps 0-d arrays 0-d)
            view = memoryview(arr).cast("B") if arr.nbytes else b""
            f.write(view)
            entries.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape),
                            "offset": offset, "nbytes": arr.nbytes, "crc32": zlib.crc32(view)})
            offset += arr.nbytes
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_data, directory / data_name)
    manifest = {
        "format": FORMAT, "step": step, "created": time.time(), "data": data_name,
        "pserver_id": state.pserver_id, "sync": state.sync, "trainers": state.trainers,
        "fingerprint": state.fingerprint,
        "optimizer": state.opt.config() if state.opt is not None else None,
        "sparse": [t.meta() for t in state.sparse.values()],
        "arrays": entries,
    }
    write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1))
    _fsync_dir(directory)
    for old in directory.glob("shard-*.bin"):
        if old.name != data_name:
            old.unlink(missing_ok=True)
    return directory / MANIFEST


def load(state: ShardState, directory: Path) -> Optional[dict]:
    """Fill ``state`` from the checkpoint in ``directory``; None if there is none yet."""
    for stale in directory.glob(".*.tmp"):            # a save cut short by a crash
        stale.unlink(missing_ok=True)
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{path}: format {manifest.get('format')}, expected {FORMAT}")
        arrays = _read_arrays(directory / manifest["data"], manifest["arrays"])
    except (OSError, ValueError, KeyError, TypeError, BadRequest) as exc:
        raise CheckpointError(f"unreadable checkpoint {path}: {exc}") from None
    state.step = int(manifest["step"])
    state.fingerprint = manifest.get("fingerprint")
    if manifest.get("optimizer"):
        state.opt = optim.from_config(manifest["optimizer"])
    opt_arrays = {}
    for name, arr in arrays.items():
        kind, _, rest = name.partition("/")
        if kind == "dense":
            state.dense[rest] = arr
        elif kind == "opt":
            opt_arrays[rest] = arr
    if state.opt is not None:
        state.opt.load_state_arrays(opt_arrays)
    for meta in manifest.get("sparse", []):
        prefix = f"sparse/{meta['name']}/"
        state.sparse[meta["name"]] = SparseTable.restore(
            meta, {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
    return manifest


def _read_arrays(data: Path, entries) -> Dict[str, np.ndarray]:
    out = {}
    with open(data, "rb") as f:
        for e in entries:
            dtype, shape = safe_dtype(e["dtype"]), safe_shape(e["shape"])
            f.seek(e["offset"])
            raw = bytearray(e["nbytes"])
            if f.readinto(raw) != len(raw) or zlib.crc32(raw) != e["crc32"]:
                raise CheckpointError(f"{data}: {e['name']} is truncated or corrupt")
            out[e["name"]] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return out
