"""The ``fluidctl shard-data`` engine: one shard per trainer, at the speed of the disk.

Pure of click and rich (the command wraps it). How it stays fast and small:

* ``--by lines`` / ``--by files`` never pass the data through Python objects. Cut points are
  found by reading only around them; every shard is then a list of byte ranges of the inputs
  (:class:`Segment`). Per shard, one task has the kernel copy its ranges (``copy_file_range``)
  while another reads them 256 KiB at a time and hashes (xxh3-128 by default, or blake3 /
  sha256) and counts them (StringZilla, no numpy) for the manifest, on a thread per core.
  ``--checksum none`` skips the digest.
* Gzip inputs are decompressed once into a spool file inside the staging directory and then
  take the same byte-range path; the spool is deleted before the output appears.
* ``--shuffle`` is an external shuffle (records scattered into random bucket files, then each
  bucket shuffled in memory; a bucket that comes out too big is scattered again), so memory
  stays bounded whatever the input size. Shards then get equal record counts (+-1).
* ``--equalize truncate`` counts records per shard first and cuts the ranges; ``pad`` appends
  records re-sampled (seeded) from the shard itself after it is written, extending its digest.
* Output is built in a hidden staging directory next to OUT_DIR and renamed into place at the
  end; on any error (bad input, disk full, Ctrl-C) the staging directory is removed.

Modules, in the order a run meets them: options (what is asked), inputs (what is read), plan
(where shards are cut; scan looks into files for it), copy (writing shards; parallel runs one
per core), shuffle, equalize, manifest, staging (nothing half-written), engine (the whole run).
tuning holds the buffer and bucket sizes.
"""
from __future__ import annotations

import os

# numpy's BLAS threads would only compete with the copy threads for cores: none is used here.
# Set before any module of this package imports numpy (numpy itself is imported only by the
# paths that need it: start-up is most of a small run).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from fluidctl.shardlayout import FORMATS
from fluidctl.sharding import tuning
from fluidctl.sharding.copy import ShardWriter
from fluidctl.sharding.engine import shard
from fluidctl.sharding.inputs import Source
from fluidctl.sharding.options import (BY_CHOICES, CHECKSUM_CHOICES,
                                       EQUALIZE_CHOICES, Progress, ShardOptions, ShardResult)
from fluidctl.sharding.plan import Segment

__all__ = ["BY_CHOICES", "CHECKSUM_CHOICES", "EQUALIZE_CHOICES", "FORMATS", "Progress",
           "Segment", "ShardOptions", "ShardResult", "ShardWriter", "Source", "shard",
           "shuffle_shards", "tuning"]


def __getattr__(name: str):
    if name == "shuffle_shards":        # imports numpy: only when asked for
        from fluidctl.sharding.shuffle import shuffle_shards
        return shuffle_shards
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
