"""The manifest.json that describes the shards (read back by fluidctl.runtime.data)."""
from __future__ import annotations

import os

try:        # json's own C function for strings; json itself imports re (and enum)
    from _json import encode_basestring_ascii as _quote
except ImportError:                                         # pragma: no cover - not CPython
    from json.encoder import encode_basestring_ascii as _quote

from fluidctl import __version__
from fluidctl.shardlayout import CANONICAL, MANIFEST_VERSION, PER_TRAINER
from fluidctl.sharding.inputs import Source, _short
from fluidctl.sharding.options import ShardOptions, ShardResult

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import List


def _manifest(opts: ShardOptions, name: str, results: List[ShardResult],
              sources: List[Source]) -> dict:
    manifest = {
        "fluidctl": __version__,
        "manifest_version": MANIFEST_VERSION,
        "layout": CANONICAL if opts.canonical else PER_TRAINER,
        "trainers": None if opts.canonical else opts.trainers,    # canonical: any number
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
        "shards": [dict({"index": r.index, "file": r.file, "records": r.records,
                         "bytes": r.bytes,
                         "checksum": None if r.digest is None else opts.checksum,
                         "digest": r.digest}, **({"offsets": r.offsets} if r.offsets else {}))
                   for r in results],
    }
    if opts.format == "csv":
        manifest["header"] = _short(sources[0].header, 10_000)
    return manifest


def to_json(value, level: int = 0) -> str:
    """``json.dumps(value, indent=2)``, byte for byte, for what a manifest holds (dicts, lists,
    strings, numbers, booleans, None), without importing json: json imports re and enum, which a
    small shard-data run is spared. tests/unit/test_shard_data.py holds it to json.dumps."""
    if isinstance(value, str):
        return _quote(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    pad = "\n" + "  " * (level + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (_quote(_key(k)) + ": " + to_json(v, level + 1) for k, v in value.items())
        return "{" + pad + ("," + pad).join(items) + "\n" + "  " * level + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return ("[" + pad + ("," + pad).join(to_json(v, level + 1) for v in value) + "\n"
                + "  " * level + "]")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _key(key) -> str:
    """A key as json writes it: a str as it is, a number, bool or None as its JSON text."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (int, float)):
        return to_json(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
