"""The on-disk layout of a shard directory, shared by its writer (``fluidctl shard-data``,
:mod:`fluidctl.sharding`) and its reader (:mod:`fluidctl.runtime.data`): file names, the
manifest's name and version, the record formats.

Standard library only and nothing else imported: shard-data's start-up is part of its speed,
and the writer should not load the training runtime to learn a file name.
"""

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 3          # 3: "layout"; 2: per shard "checksum" + "digest"; 1: "sha256"
FORMATS = ("text", "csv", "jsonl")
# "per-trainer" (--trainers N: shard i is trainer i's) or "canonical" (--shards N: every rank
# reads its part of an epoch's global order over all of them); manifests before 3 are per-trainer
PER_TRAINER, CANONICAL = "per-trainer", "canonical"


def layout(manifest: dict) -> str:
    """The layout a manifest describes."""
    return manifest.get("layout", PER_TRAINER)


def shard_name(name: str, index: int, suffix_length: int = 5) -> str:
    """``train.txt``, 3 -> ``train.txt-00003``: the seeds' numeric-suffix convention."""
    return f"{name}-{index:0{suffix_length}d}"


# canonical shards (--shards N): the byte offset of every record's start, then the end of the
# last record, as little-endian uint64, in OUT_DIR/offsets/<shard>.idx (named in the manifest's
# shard entry as "offsets"); a folder of its own, so that a glob of the shards matches shards only
OFFSETS_FOLDER, OFFSETS_SUFFIX = "offsets", ".idx"


def offsets_name(shard_file: str) -> str:
    """``train.txt-00003`` -> ``offsets/train.txt-00003.idx`` (relative to the directory)."""
    return f"{OFFSETS_FOLDER}/{shard_file}{OFFSETS_SUFFIX}"
