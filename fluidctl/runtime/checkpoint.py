"""Verified checkpoints: every rank's part written, fsynced and hashed, committed all at once.

    ckpt = Checkpointer(ctx, "ckpt")
    found = ckpt.load()                  # the newest sound checkpoint, None if none exists
    step = found.step + 1 if found else 0
    ...
    if ctx.checkpoint_requested():
        ckpt.save(step, {"w": w, "m": m}, meta={"epoch": epoch})
        if ctx.checkpoint_stop:
            break

``save`` writes this rank's arrays (raw bytes, C order) into ``.partial-step-N/part-R.bin``,
hashing them on the way (``fluidctl.digest``) and fsyncing; each rank leaves its part's size
and digest beside it; after a barrier rank 0 checks every part is there with that size, writes
the manifest (step, world size, each part's size, digest and arrays, the caller's ``meta``),
fsyncs and renames the directory to ``step-N`` in one step, then every rank returns. A save
killed half-way leaves only a ``.partial-`` directory, which ``load`` never looks at.
``replicated=True`` (state equal on every rank, e.g. data-parallel weights): rank 0 writes the
one part and every rank loads it, at any world size.

``load`` tries committed checkpoints newest first; each rank reads and hashes the part it
needs, and the ranks agree (a min-allreduce) to take a checkpoint only when every rank's part
is sound. A part that is missing, truncated or whose digest differs is named on stderr and
that checkpoint is skipped, never loaded; if every committed one is bad, ``load`` raises.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

from fluidctl import digest, envs, paths

FORMAT = 1


class Loaded(NamedTuple):
    step: int
    arrays: Dict[str, object]      # name -> numpy array (read-only views of one buffer)
    meta: dict
    path: Path


class CheckpointError(RuntimeError):
    pass


def _write_unsynced(path: Path, text: str) -> None:
    """Whole or absent, not durable: for what the manifest (fsynced) makes durable, or what
    only informs (the launcher's record); an fsync each would lengthen every save."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(path: Path, arrays: Dict[str, object], algorithm: str) -> dict:
    """Write ``arrays`` back to back (raw, C order) to ``path``, hashed while written, fsynced.
    Returns the part's record: size, digest, and each array's dtype, shape and offset."""
    import numpy
    hasher = digest.new(algorithm)
    index, offset = [], 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for name, value in arrays.items():
            arr = numpy.ascontiguousarray(value)
            if arr.dtype.hasobject:
                raise CheckpointError(f"array {name!r} holds Python objects; only numeric "
                                      "arrays are checkpointed (put the rest in meta=)")
            view = memoryview(arr.reshape(-1)).cast("B") if arr.size else memoryview(b"")
            hasher.update(view)
            while view:
                view = view[os.write(fd, view):]
            index.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape),
                          "offset": offset, "nbytes": arr.nbytes})
            offset += arr.nbytes
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"size": offset, "digest": hasher.hexdigest(), "algorithm": algorithm,
            "arrays": index}


def read_part(path: Path, record: dict) -> Dict[str, object]:
    """The arrays of a part, after checking its size and digest; CheckpointError names what
    is wrong (missing, truncated, longer, corrupted)."""
    import numpy
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    if size != record["size"]:
        what = "truncated" if size < record["size"] else "longer than recorded"
        raise CheckpointError(f"{path} is {what} ({size} bytes, manifest says "
                              f"{record['size']})")
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        view, got = memoryview(buf), 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{path} is truncated (read {got} of {size} bytes)")
            got += n
    hasher = digest.new(record["algorithm"])
    hasher.update(buf)
    if hasher.hexdigest() != record["digest"]:
        raise CheckpointError(f"{path} is corrupted ({record['algorithm']} digest differs from "
                              "the manifest's)")
    out = {}
    for item in record["arrays"]:
        dtype = numpy.dtype(item["dtype"])
        count = item["nbytes"] // dtype.itemsize if dtype.itemsize else 0
        out[item["name"]] = numpy.frombuffer(buf, dtype, count, item["offset"]).reshape(
            item["shape"])
    return out


class Checkpointer:
    """Save and load the checkpoints of one job in ``root`` (shared by every rank)."""

    def __init__(self, ctx, root, keep: int = 2, algorithm: str = digest.DEFAULT):
        self.ctx = ctx
        self.layout = paths.CheckpointLayout(Path(root).resolve())
        self.keep = max(1, keep)
        self.algorithm = algorithm
        state = os.environ.get(envs.CHECKPOINT_STATE)     # the launcher's record of commits
        self.state = Path(state) if state else None
        self._pruner = None                # rank 0's removal of older checkpoints (a thread)
        if getattr(ctx, "_request_state", None) is not None:
            # a script that checkpoints takes the request signals as requests from now on,
            # not only from its first checkpoint_requested()
            ctx._request_state().install()

    # --- helpers over the world -----------------------------------------------------------
    @property
    def _rank(self) -> int:
        return self.ctx.rank

    @property
    def _world(self) -> int:
        return self.ctx.world_size if self.ctx.comm is not None else 1

    def _barrier(self) -> None:
        if self._world > 1:
            self.ctx.barrier()

    def _all_ok(self, ok: bool) -> bool:
        if self._world == 1:
            return ok
        import numpy
        flag = numpy.array([1 if ok else 0], dtype=numpy.int64)
        self.ctx.allreduce(flag, op="min")
        return bool(flag[0])

    # --- save -----------------------------------------------------------------------------
    def save(self, step: int, arrays: Dict[str, object], meta: Optional[dict] = None,
             replicated: bool = False) -> Path:
        """Commit ``arrays`` (this rank's state; with ``replicated``, rank 0's stands for all)
        as checkpoint ``step``; returns its directory once every rank's part is committed."""
        started = time.time()
        self.wait()                        # the last save's clean-up, off its critical path
        staging = self.layout.staging(step)
        writes = not replicated or self._rank == 0
        if writes:
            staging.mkdir(parents=True, exist_ok=True)
            record = write_part(self.layout.part(staging, self._rank), arrays, self.algorithm)
            _write_unsynced(self.layout.part_record(staging, self._rank), json.dumps(record))
        self._barrier()               # every part is on disk (fsynced) before the manifest
        final = self.layout.committed(step)
        if self._rank == 0:
            self._commit(step, staging, final, 1 if replicated else self._world, meta or {},
                         started)
        self._barrier()               # nobody returns before the commit
        return final

    def _commit(self, step, staging: Path, final: Path, parts: int, meta: dict,
                started: float) -> None:
        records = []
        for rank in range(parts):
            rec_path = self.layout.part_record(staging, rank)
            try:
                record = json.loads(rec_path.read_text())
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"checkpoint step {step}: rank {rank}'s part was not "
                                      f"written ({rec_path}: {exc})") from None
            size = os.stat(self.layout.part(staging, rank)).st_size
            if size != record["size"]:
                raise CheckpointError(f"checkpoint step {step}: rank {rank}'s part has "
                                      f"{size} bytes, {record['size']} written")
            record["file"] = self.layout.part(staging, rank).name
            records.append(record)
            rec_path.unlink()
        manifest = {"format": FORMAT, "step": step, "world_size": self._world,
                    "replicated": parts == 1 and self._world > 1, "parts": records,
                    "meta": meta, "time": time.time()}
        paths.write_atomic(staging / paths.CheckpointLayout.MANIFEST,
                           json.dumps(manifest, indent=1))
        _fsync_dir(staging)
        trash = None
        if final.exists():            # the same step saved again (a resumed job)
            trash = self.layout.trash(step)
            os.replace(final, trash)
        os.replace(staging, final)
        _fsync_dir(self.layout.root)
        # older checkpoints go in the background (not a daemon: the interpreter waits for it
        # at exit); a removal cut short leaves an older one the loader names and skips
        import threading
        self._pruner = threading.Thread(target=self._prune, args=(step, trash),
                                        name="fluidctl-checkpoint-prune")
        self._pruner.start()
        if self.state is not None:
            stop = self.ctx._requests is not None and self.ctx.checkpoint_stop
            try:
                _write_unsynced(self.state, json.dumps({
                    "step": step, "dir": str(final), "time": time.time(),
                    "seconds": round(time.time() - started, 3), "stop": bool(stop)}))
            except OSError:
                pass

    def wait(self) -> None:
        """Wait for the removal of checkpoints older than the ``keep`` newest."""
        if self._pruner is not None:
            self._pruner.join()
            self._pruner = None

    def _prune(self, committed: int, trash: Optional[Path]) -> None:
        """Remove what is committed and older than the ``keep`` newest, and the commit this
        save replaced; never a ``.partial-`` directory: another rank may already be writing
        this job's next save into one, or another job its own (torch DCP and Orbax likewise
        never delete uncommitted data the same save did not write). A save killed half-way
        leaves its ``.partial-`` directory; saving that step again reuses it."""
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        for step in self.layout.steps()[self.keep:]:
            if step < committed:
                shutil.rmtree(self.layout.committed(step), ignore_errors=True)

    # --- load -----------------------------------------------------------------------------
    def load(self, fresh_if_none_sound: bool = False) -> Optional[Loaded]:
        """The newest checkpoint every rank can load whole; None when there is none at all.
        Bad ones are named on stderr and skipped; every rank takes the same one. When
        checkpoints are committed but none is sound, CheckpointError (on every rank) unless
        ``fresh_if_none_sound``: starting at step 0 would quietly throw the training away and
        write over them, and a resume that cannot resume is an error in torch DCP and Orbax
        too (they raise on a checkpoint they cannot read)."""
        steps = self.layout.steps()
        if self._world > 1:        # the same candidates on every rank (rank 0's listing)
            import numpy
            count = numpy.array([len(steps) if self._rank == 0 else 0], dtype=numpy.int64)
            self.ctx.broadcast(count)
            listed = numpy.zeros(int(count[0]), dtype=numpy.int64)
            if self._rank == 0:
                listed[:] = steps
            if len(listed):
                self.ctx.broadcast(listed)
            steps = [int(s) for s in listed]
        for step in steps:
            found, why = self._try(step)
            if not self._all_ok(found is not None):
                if why and (self._rank == 0 or found is None):
                    print(f"fluidctl: rank {self._rank}: checkpoint {why}; skipped",
                          file=sys.stderr, flush=True)
                elif self._rank == 0:
                    print(f"fluidctl: checkpoint {self.layout.committed(step)}: another rank's "
                          "part is bad; skipped", file=sys.stderr, flush=True)
                continue
            return found
        if steps and not fresh_if_none_sound:
            raise CheckpointError(
                f"none of the {len(steps)} committed checkpoints in {self.layout.root} can be "
                "loaded (each is named above); move them away to start from step 0, or call "
                "load(fresh_if_none_sound=True)")
        return None

    def _try(self, step: int):
        where = self.layout.committed(step)
        try:
            manifest = json.loads((where / paths.CheckpointLayout.MANIFEST).read_text())
            if manifest.get("format") != FORMAT or manifest.get("step") != step:
                raise CheckpointError(f"{where}: not a checkpoint of this format")
            parts: List[dict] = manifest["parts"]
            if len(parts) == 1:
                record = parts[0]
            elif len(parts) == self._world:
                record = parts[self._rank]
            else:
                raise CheckpointError(
                    f"{where} holds {len(parts)} parts and this job has {self._world} ranks "
                    "(save replicated=True state to resume at another world size)")
            arrays = read_part(where / record["file"], record)
        except FileNotFoundError:
            return None, f"{where} has no manifest (not a complete checkpoint)"
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"{where}: unreadable manifest ({exc})"
        except CheckpointError as exc:
            return None, str(exc)
        return Loaded(step, arrays, manifest.get("meta", {}), where), ""
