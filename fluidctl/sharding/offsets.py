"""``shard-data --shards N``: a record-offset index beside every canonical shard, in
``offsets/`` (:mod:`fluidctl.runtime.recordindex`), so that each reading rank loads 8 bytes a
record instead of scanning the whole shard for newlines. Written from the finished shards, in
parallel, before the manifest, which names each index with its size and digest."""
from __future__ import annotations

import mmap
import os

from fluidctl import digest
from fluidctl.shardlayout import OFFSETS_FOLDER, offsets_name
from fluidctl.sharding.options import ShardResult
from fluidctl.sharding.parallel import _parallel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List


def write_index(directory: str, shard_file: str, header_lines: int, checksum: str) -> dict:
    """Write ``offsets/<shard>.idx`` in ``directory``; its manifest entry (file, bytes,
    checksum, digest)."""
    import numpy as np
    from fluidctl.runtime import recordindex
    with open(os.path.join(directory, shard_file), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as view:
                data = np.frombuffer(view, dtype=np.uint8)
                starts = recordindex.line_starts(data, header_lines)
                del data
        else:
            starts = recordindex.line_starts(np.zeros(0, dtype=np.uint8), header_lines)
    name = offsets_name(shard_file)
    raw = starts.astype(recordindex.DTYPE).tobytes()
    with open(os.path.join(directory, name), "xb") as out:
        out.write(raw)
    algorithm = None if checksum == "none" else checksum
    hex_digest = None
    if algorithm:
        hasher = digest.new(algorithm)
        hasher.update(raw)
        hex_digest = hasher.hexdigest()
    return {"file": name, "bytes": len(raw), "checksum": algorithm,
            "digest": hex_digest}


def with_indexes(results: List[ShardResult], directory: str, header_lines: int,
                 checksum: str) -> List[ShardResult]:
    """The shards' results (shards in ``directory``), each with the entry of its index."""
    os.mkdir(os.path.join(directory, OFFSETS_FOLDER))
    entries = _parallel(lambda i, stop: write_index(directory, results[i].file, header_lines,
                                                    checksum), len(results))
    return [r._replace(offsets=e) for r, e in zip(results, entries)]
