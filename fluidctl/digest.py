"""Content digests: the one place that maps an algorithm name to a hash object.

The shard-data manifest records, next to each digest, the name of the algorithm that made it,
so a shard is checked with the algorithm it was hashed with (``fluidctl shard-data --verify``,
``ShardReader(verify=True)``, the check on the nodes after ``--to-hosts``). Standard library
only at import time: the hash packages are imported when a digest is asked for.

* ``xxh3-128`` (the ``xxhash`` package): the default. 0.02 CPU-s per GiB; a 128-bit
  non-cryptographic hash, which finds corrupted or truncated copies (its collisions are not
  found by accident) but does not resist a forger.
* ``blake3`` (the ``blake3`` package): cryptographic, 0.18 CPU-s per GiB on one core here.
* ``sha256`` (hashlib): cryptographic, 0.6 CPU-s per GiB (with SHA-NI); what ``sha256sum``
  checks.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Any

ALGORITHMS = ("xxh3-128", "blake3", "sha256")
DEFAULT = "xxh3-128"
_PACKAGES = {"xxh3-128": "xxhash", "blake3": "blake3"}


class UnknownAlgorithm(ValueError):
    pass


def new(algorithm: str) -> Any:
    """A fresh hash object (``update(buffer)``, ``hexdigest()``) for ``algorithm``."""
    try:
        if algorithm == "xxh3-128":
            import xxhash
            return xxhash.xxh3_128()
        if algorithm == "blake3":
            from blake3 import blake3
            return blake3()
    except ImportError:
        raise UnknownAlgorithm(f"{algorithm} needs the {_PACKAGES[algorithm]} package "
                               f"(pip install {_PACKAGES[algorithm]})") from None
    if algorithm == "sha256":
        import hashlib
        return hashlib.sha256()
    raise UnknownAlgorithm(f"unknown digest algorithm {algorithm!r} (known: "
                           f"{', '.join(ALGORITHMS)})")


def file_digest(path: str, algorithm: str, block: int = 1 << 20) -> str:
    """Hex digest of a whole file, read through one reused buffer."""
    hasher = new(algorithm)
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            hasher.update(view[:n])
    return hasher.hexdigest()
