"""The manifest.json that describes the shards (read back by fluidctl.runtime.data)."""
from __future__ import annotations

import os
from typing import List

from fluidctl import __version__
from fluidctl.shardlayout import MANIFEST_VERSION
from fluidctl.sharding.inputs import Source, _short
from fluidctl.sharding.options import ShardOptions, ShardResult


def _manifest(opts: ShardOptions, name: str, results: List[ShardResult],
              sources: List[Source]) -> dict:
    manifest = {
        "fluidctl": __version__,
        "manifest_version": MANIFEST_VERSION,
        "trainers": opts.trainers,
        "format": opts.format,
        "name": name,
        "inputs": [{"path": os.path.abspath(s.display), "bytes": s.input_bytes, "gzip": s.gzip}
                   for s in sources],
        "options": {"by": opts.by, "format": opts.format, "shuffle": opts.shuffle,
                    "seed": opts.seed, "equalize": opts.equalize,
                    "suffix_length": opts.suffix_length, "checksum": opts.checksum},
        "records": sum(r.records for r in results),
        "bytes": sum(r.bytes for r in results),
        # the algorithm beside every digest: a shard is verified with what made its digest
        "shards": [{"index": r.index, "file": r.file, "records": r.records, "bytes": r.bytes,
                    "checksum": None if r.digest is None else opts.checksum,
                    "digest": r.digest} for r in results],
    }
    if opts.format == "csv":
        manifest["header"] = _short(sources[0].header, 10_000)
    return manifest
