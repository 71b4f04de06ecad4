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

import csv
import glob
import gzip
import hashlib
import io
import json
import os
import re
from typing import Any, Iterable, Iterator, List, Mapping, Optional

from fluidctl import envs
from fluidctl.errors import UsageError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
FORMATS = ("text", "csv", "jsonl")
_NUMBERED = re.compile(r"^(?P<name>.+)-(?P<index>\d+)$")


def shard_name(name: str, index: int, suffix_length: int = 5) -> str:
    """``train.txt``, 3 -> ``train.txt-00003``: the seeds' numeric-suffix convention."""
    return f"{name}-{index:0{suffix_length}d}"


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
    is returned and no count can be checked. ``verify=True`` re-computes the shard's sha256
    against the manifest (reads the whole file).
    """
    rank, world = _rank_world(rank, world, environ)
    target = os.fspath(pattern_or_dir)
    if "{" in target:
        path = target.format(rank=rank, trainer_id=rank, world=world)
        if not os.path.isfile(path):
            raise UsageError(f"shard {path} for trainer {rank} does not exist",
                             "check the pattern and that shard-data ran for this node")
        return path
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


def verify_shard(path: str) -> None:
    """Compare a shard's size and sha256 with its manifest entry (when it has one)."""
    info = shard_info(path)
    if info is None:
        return
    size = os.path.getsize(path)
    if size != info.get("bytes", size):
        raise UsageError(f"shard {path} has {size} bytes, the manifest says {info['bytes']}",
                         "copy the shard again or re-run fluidctl shard-data")
    if info.get("sha256"):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != info["sha256"]:
            raise UsageError(f"shard {path} does not match the sha256 in its manifest",
                             "copy the shard again or re-run fluidctl shard-data")


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


class ShardReader:
    """This trainer's shard as an iterable of batches; iterate once per epoch.

    ``len(reader)`` is the number of batches, from the manifest's record count when there is one
    (so NCCL2 jobs can check every trainer runs the same number of steps before starting).
    """

    def __init__(self, pattern_or_dir: str = "shards", batch_size: int = 32, *,
                 drop_last: bool = False, format: Optional[str] = None, decode: bool = True,
                 environ: Optional[Mapping[str, str]] = None):
        self.path = shard_path(pattern_or_dir, environ=environ)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.format = format
        self.decode = decode
        if batch_size < 1:
            raise UsageError(f"batch size must be at least 1, not {batch_size}",
                             "pass batch_size=32")
        info = shard_info(self.path)
        self.records = info["records"] if info else None

    def __iter__(self) -> Iterator[list]:
        return batches(iter_records(self.path, self.format, decode=self.decode),
                       self.batch_size, self.drop_last)

    def __len__(self) -> int:
        records = self.records
        if records is None:
            records = sum(1 for _ in iter_records(self.path, self.format, decode=False))
            self.records = records
        full, rest = divmod(records, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)
