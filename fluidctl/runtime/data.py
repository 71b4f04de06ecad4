"""Data shards for training processes: which file is mine, and its records in batches.

``fluidctl shard-data`` writes ``OUT_DIR/<name>-00000 ...`` and ``OUT_DIR/manifest.json``; a
trainer calls :func:`shard_path` to get its own shard (rank and trainer count come from the
environment contract, ``fluidctl.envs.read()``), then :class:`ShardReader` (or
:func:`iter_records` + :func:`batches`) to read it. The manifest's shard count must equal the
number of trainers, or NCCL2 jobs would silently train on a wrong split: that is an error naming
both numbers.

Import-light on purpose (standard library only): every training process imports it.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import os
import re
from typing import Any, Iterable, Iterator, List, Mapping, Optional

from fluidctl import envs
from fluidctl.errors import UsageError

from fluidctl.shardlayout import (CANONICAL, FORMATS, MANIFEST_NAME, MANIFEST_VERSION,  # noqa: F401
                                  layout, shard_name)

_NUMBERED = re.compile(r"^(?P<name>.+)-(?P<index>\d+)$")


def read_manifest(directory: str) -> Optional[dict]:
    """The manifest of a shard directory, or None when it has none."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open(path, "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read shard manifest {path}: {exc}",
                         "re-run fluidctl shard-data with --force") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise UsageError(f"{path} is not a fluidctl shard manifest",
                         "re-run fluidctl shard-data with --force")
    return manifest


def _rank_world(rank: Optional[int], world: Optional[int],
                environ: Optional[Mapping[str, str]]) -> tuple:
    if rank is None or world is None:
        dist = envs.read(environ)
        rank = dist.rank if rank is None else rank
        world = dist.world_size if world is None else world
    if not 0 <= rank < world:
        raise UsageError(f"trainer id {rank} is outside 0..{world - 1}",
                         f"check {envs.TRAINER_ID} and {envs.TRAINERS_NUM}")
    return rank, world


def _count_mismatch(where: str, shards: int, world: int) -> UsageError:
    return UsageError(
        f"{where} holds {shards} shard(s) but this job has {world} trainer(s) "
        f"({envs.TRAINERS_NUM}={world})",
        f"re-shard with: fluidctl shard-data ... --trainers {world} -o {where} --force")


def shard_paths(pattern_or_dir: str) -> List[str]:
    """Every shard, in index order, from a shard directory (manifest first, else the numbered
    files in it), a manifest.json path, or a glob such as ``data/train.txt-*``."""
    target = os.fspath(pattern_or_dir)
    if os.path.basename(target) == MANIFEST_NAME and os.path.isfile(target):
        target = os.path.dirname(target) or "."
    if os.path.isdir(target):
        manifest = read_manifest(target)
        if manifest is not None:
            return [os.path.join(target, s["file"]) for s in manifest["shards"]]
        candidates = [os.path.join(target, n) for n in os.listdir(target)]
    else:
        candidates = glob.glob(target)
    numbered = []
    for path in candidates:
        match = _NUMBERED.match(os.path.basename(path))
        if match and os.path.isfile(path):
            numbered.append((int(match.group("index")), path))
    if not numbered:
        raise UsageError(f"no shards found at {target}",
                         "pass the -o directory of fluidctl shard-data, or a glob like "
                         "'data/train.txt-*'")
    numbered.sort()
    indices = [i for i, _ in numbered]
    if indices != list(range(len(indices))):
        raise UsageError(f"shards at {target} are not numbered 0..{len(indices) - 1}: {indices[:8]}",
                         "re-run fluidctl shard-data with --force")
    return [p for _, p in numbered]


def shard_path(pattern_or_dir: str = "shards", *, rank: Optional[int] = None,
               world: Optional[int] = None, environ: Optional[Mapping[str, str]] = None,
               verify: bool = False) -> str:
    """This trainer's shard: index PADDLE_TRAINER_ID of the shards at ``pattern_or_dir``.

    The shard count must equal PADDLE_TRAINERS_NUM (the manifest's count when there is one).
    ``pattern_or_dir`` may also hold ``{rank}`` (``"data/part-{rank:05d}"``): then that one file
    is returned and no count can be checked. ``verify=True`` re-computes the shard's digest
    against the manifest, with the algorithm the manifest names (reads the whole file).
    """
    rank, world = _rank_world(rank, world, environ)
    target = os.fspath(pattern_or_dir)
    if "{" in target:
        path = target.format(rank=rank, trainer_id=rank, world=world)
        if not os.path.isfile(path):
            raise UsageError(f"shard {path} for trainer {rank} does not exist",
                             "check the pattern and that shard-data ran for this node")
        return path
    manifest = read_manifest(target) if os.path.isdir(target) else None
    if manifest is not None and layout(manifest) == CANONICAL:
        raise UsageError(f"{target} holds {len(manifest['shards'])} canonical shards "
                         "(shard-data --shards), not one per trainer",
                         f"read them with ShardReader({target!r}, batch_size=...), which "
                         "gives each rank its part of every epoch")
    paths = shard_paths(target)
    if len(paths) != world:
        raise _count_mismatch(target, len(paths), world)
    path = paths[rank]
    if not os.path.isfile(path):
        raise UsageError(f"shard {path} for trainer {rank} does not exist",
                         "copy the shard to this node or re-run fluidctl shard-data")
    if verify:
        verify_shard(path)
    return path


def shard_info(path: str) -> Optional[dict]:
    """The manifest entry of one shard file (records, bytes, sha256), or None."""
    manifest = read_manifest(os.path.dirname(path) or ".")
    if manifest is None:
        return None
    base = os.path.basename(path)
    for entry in manifest["shards"]:
        if entry.get("file") == base:
            return dict(entry, format=manifest.get("format", "text"))
    return None


def shard_digest(entry: Mapping[str, Any]) -> tuple:
    """(algorithm, hex digest) of a manifest's shard entry; (None, None) when it has none.
    Version 1 manifests hold ``"sha256": hex``; version 2 ``"checksum": alg, "digest": hex``."""
    if entry.get("digest"):
        return entry.get("checksum"), entry["digest"]
    if entry.get("sha256"):
        return "sha256", entry["sha256"]
    return None, None


def check_shard(path: str, entry: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with one shard file against its manifest entry, or None: missing, size,
    then digest (with the algorithm that made it)."""
    from fluidctl import digest
    try:
        size = os.path.getsize(path)
    except OSError:
        return f"shard {path} is missing"
    if "bytes" in entry and size != entry["bytes"]:
        return f"shard {path} has {size} bytes, the manifest says {entry['bytes']}"
    algorithm, expected = shard_digest(entry)
    if algorithm is None:
        return None
    try:
        got = digest.file_digest(path, algorithm)
    except digest.UnknownAlgorithm as exc:
        return f"cannot check shard {path}: {exc}"
    if got != expected:
        return f"shard {path} does not match the {algorithm} digest in its manifest"
    return None


_FIX = "copy the shard again or re-run fluidctl shard-data"


def verify_shard(path: str) -> None:
    """Compare a shard's size and digest with its manifest entry (when it has one)."""
    info = shard_info(path)
    if info is None:
        return
    problem = check_shard(path, info)
    if problem:
        raise UsageError(problem, _FIX)


def verify_dir(directory: str, workers: int = 0) -> List[str]:
    """Check every shard of a shard-data directory (and a canonical shard's offset index)
    against its manifest (in parallel threads: the hashes release the GIL); returns one message
    per bad file, in shard order."""
    from concurrent.futures import ThreadPoolExecutor
    manifest = read_manifest(directory)
    if manifest is None:
        raise UsageError(f"{directory} has no {MANIFEST_NAME}",
                         "pass the -o directory of fluidctl shard-data")
    entries = manifest["shards"]
    if not entries:
        return []
    workers = workers or min(len(entries), os.cpu_count() or 1)
    # a canonical shard's record-offset index (``offsets``) is checked like its shard
    files = [f for e in entries
             for f in (e, e.get("offsets")) if isinstance(f, Mapping) and f.get("file")]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        problems = pool.map(lambda e: check_shard(os.path.join(directory, e["file"]), e), files)
        return [p for p in problems if p]


def _open_binary(path: str):
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb", buffering=1 << 20)


def iter_records(path: str, format: Optional[str] = None, *, decode: bool = True,
                 encoding: str = "utf-8") -> Iterator[Any]:
    """Records of one file, streamed: ``text`` -> str without its line ending (bytes with
    ``decode=False``), ``csv`` -> list of fields (header skipped), ``jsonl`` -> parsed objects.
    The format defaults to the manifest's, else ``text``. Gzip files are read transparently."""
    if format is None:
        info = shard_info(path)
        format = info["format"] if info else "text"
    if format not in FORMATS:
        raise UsageError(f"unknown record format {format!r}", f"use one of {', '.join(FORMATS)}")
    with _open_binary(path) as raw:
        if format == "csv":
            text = io.TextIOWrapper(raw, encoding=encoding, newline="")
            import csv          # only for csv shards: a tenth of shard-data's start-up
            rows = csv.reader(text)
            next(rows, None)
            yield from rows
            return
        for line in raw:
            if format == "jsonl":
                yield json.loads(line)
            elif decode:
                yield line.decode(encoding).rstrip("\r\n")
            else:
                yield line.rstrip(b"\r\n")


def batches(records: Iterable[Any], batch_size: int, drop_last: bool = False) -> Iterator[list]:
    """Group records into lists of ``batch_size``; the last, shorter one unless ``drop_last``."""
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, not {batch_size}", "pass batch_size=32")
    batch: list = []
    for record in records:
        batch.append(record)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch


def timed(loader: Iterable[Any]) -> Iterator[Any]:
    """``loader``'s items, the time each one took counted as this rank's data time: the
    launcher's straggler report names a rank whose data loader sets the job's pace."""
    from fluidctl.diagnostics import stragglers
    return stragglers.timed_batches(loader)


class ShardReader:
    """This trainer's batches; iterate once per epoch.

    Over per-trainer shards (``shard-data --trainers N``): this trainer's shard, in file order.
    Over canonical shards (``shard-data --shards N``): this rank's part of the epoch's global
    order, a permutation of every sample fixed by (``seed``, epoch) whatever the world size
    (:mod:`fluidctl.runtime.order`); ``reader.state()`` is what to save with a checkpoint and
    ``ShardReader(..., state=saved)`` resumes at any world size with exactly the samples of the
    epoch not yet handed out. ``shuffle=False`` reads the shards in index order.

    ``len(reader)`` is the number of batches (left in this epoch, for canonical shards), from
    the manifest's record counts when there is one (so NCCL2 jobs can check every trainer runs
    the same number of steps before starting). ``verify=True`` checks the shards this reader
    reads against the manifest's sizes and digests first and raises ``UsageError`` naming one
    that differs.
    """

    def __init__(self, pattern_or_dir: str = "shards", batch_size: int = 32, *,
                 drop_last: bool = False, format: Optional[str] = None, decode: bool = True,
                 environ: Optional[Mapping[str, str]] = None, verify: bool = False,
                 seed: Optional[int] = None, shuffle: Optional[bool] = None,
                 state: Optional[Mapping[str, Any]] = None, rank: Optional[int] = None,
                 world: Optional[int] = None):
        if batch_size < 1:
            raise UsageError(f"batch size must be at least 1, not {batch_size}",
                             "pass batch_size=32")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.format = format
        self.decode = decode
        target = os.fspath(pattern_or_dir)
        manifest = read_manifest(target) if os.path.isdir(target) else None
        self._global = None
        if manifest is not None and layout(manifest) == CANONICAL:
            self._global = _canonical(target, manifest, self, rank, world, environ, verify,
                                      seed, shuffle, state)
            self.path, self.records = target, manifest["records"]
            return
        if seed is not None or shuffle is not None or state is not None:
            raise UsageError(f"seed=, shuffle= and state= need canonical shards, and "
                             f"{target} holds one shard per trainer",
                             f"re-shard with: fluidctl shard-data ... --shards 16 -o {target} "
                             "--force")
        self.path = shard_path(target, rank=rank, world=world, environ=environ, verify=verify)
        info = shard_info(self.path)
        self.records = info["records"] if info else None

    def state(self) -> dict:
        """Epoch and global offset (with the seed, shuffle and data-set size they hold for):
        every batch handed out so far counts as consumed. Canonical shards only."""
        if self._global is None:
            raise UsageError(f"{self.path} is a per-trainer shard: its reader has no state to "
                             "resume at another world size",
                             "shard the data with fluidctl shard-data --shards N")
        return self._global.state()

    @property
    def epoch(self) -> Optional[int]:
        """The epoch the next iteration reads (canonical shards), else None."""
        return None if self._global is None else self._global.epoch

    def __iter__(self) -> Iterator[list]:
        if self._global is not None:
            return timed(iter(self._global))     # data time for the straggler report
        return timed(batches(iter_records(self.path, self.format, decode=self.decode),
                             self.batch_size, self.drop_last))

    def __len__(self) -> int:
        if self._global is not None:
            return len(self._global)
        records = self.records
        if records is None:
            records = sum(1 for _ in iter_records(self.path, self.format, decode=False))
            self.records = records
        full, rest = divmod(records, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


def _canonical(directory: str, manifest: dict, opts: ShardReader, rank, world, environ,
               verify: bool, seed, shuffle, state):
    from fluidctl.runtime.canonical import CanonicalReader
    rank, world = _rank_world(rank, world, environ)
    if verify:
        problems = verify_dir(directory)
        if problems:
            raise UsageError(problems[0], _FIX)
    fmt = opts.format or manifest.get("format", "text")
    if fmt not in FORMATS:
        raise UsageError(f"unknown record format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    entries = manifest["shards"]
    indexes = [os.path.join(directory, e["offsets"]["file"])
               if isinstance(e.get("offsets"), dict) and e["offsets"].get("file") else None
               for e in entries]
    return CanonicalReader([os.path.join(directory, e["file"]) for e in entries],
                           [e["records"] for e in entries], fmt, opts.batch_size, rank=rank,
                           world=world, seed=0 if seed is None else seed,
                           shuffle=True if shuffle is None else shuffle,
                           drop_last=opts.drop_last, decode=opts.decode, state=state,
                           indexes=indexes)
