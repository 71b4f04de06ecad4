"""The on-disk layout of a shard directory, shared by its writer (``fluidctl shard-data``,
:mod:`fluidctl.sharding`) and its reader (:mod:`fluidctl.runtime.data`): file names, the
manifest's name and version, the record formats.

Standard library only and nothing else imported: shard-data's start-up is part of its speed,
and the writer should not load the training runtime to learn a file name.
"""

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2          # 2: per shard "checksum" (algorithm) + "digest"; 1: "sha256"
FORMATS = ("text", "csv", "jsonl")


def shard_name(name: str, index: int, suffix_length: int = 5) -> str:
    """``train.txt``, 3 -> ``train.txt-00003``: the seeds' numeric-suffix convention."""
    return f"{name}-{index:0{suffix_length}d}"
