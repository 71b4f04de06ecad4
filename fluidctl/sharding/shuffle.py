"""--shuffle as an external shuffle: records scattered into random bucket files, each bucket
shuffled in memory (or scattered again when too big), so memory stays bounded whatever the
input size; shards then get equal record counts (+-1)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from fluidctl.errors import UsageError
from fluidctl.sharding import tuning
from fluidctl.sharding.copy import ShardWriter
from fluidctl.sharding.inputs import Source
from fluidctl.sharding.options import Progress, ShardOptions

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import Callable, List, Optional, Sequence


def _records_of(data: bytes) -> list:
    """Newline-terminated records -> list of records without their newline."""
    records = data.split(b"\n")
    records.pop()           # what follows the last newline: nothing
    return records


def _pick(records: list, order: np.ndarray) -> list:
    """records[i] for i in order, by numpy fancy indexing on an object array (8 bytes per
    record, no Python int per index, no Python loop)."""
    table = np.empty(len(records), dtype=object)
    table[:] = records
    return table[order].tolist()


def _whole_record_blocks(path: str, start: int, block: int, progress: Progress,
                         end: Optional[int] = None):
    """Bytes [start, end) of a file in blocks of whole, newline-terminated records (a last
    record without its newline gets one)."""
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = (os.fstat(f.fileno()).st_size if end is None else end) - start
        carry: List[bytes] = []          # a record longer than a block, in pieces: joined
        while left > 0:                  # once, never re-copied per block (was quadratic)
            chunk = f.read(min(block, left))
            left -= len(chunk)
            if not chunk:
                break
            progress.advance(len(chunk))
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                carry.append(chunk)
                continue
            data = b"".join(carry + [chunk[:cut]]) if carry else chunk[:cut]
            carry = [chunk[cut:]] if cut < len(chunk) else []
            yield data
        if carry:
            yield b"".join(carry) + b"\n"


@dataclass
class Bucket:
    path: str
    bytes: int = 0
    records: int = 0


class _BucketFiles:
    """Append-only bucket files, each with a small buffer (few, large writes)."""

    def __init__(self, directory: str, count: int):
        os.makedirs(directory, exist_ok=True)
        self.buckets = [Bucket(os.path.join(directory, f"bucket-{b:04d}")) for b in range(count)]
        self.pending: List[list] = [[] for _ in range(count)]
        self.pending_bytes = [0] * count
        self.limit = max(4096, tuning.SCATTER_BUFFER // count)
        self.fds: List[int] = []
        try:
            for bucket in self.buckets:
                self.fds.append(os.open(bucket.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                        0o600))
        except OSError:
            self._close_fds()
            raise

    def add(self, b: int, piece: bytes, records: int) -> None:
        self.buckets[b].bytes += len(piece)
        self.buckets[b].records += records
        self.pending[b].append(piece)
        self.pending_bytes[b] += len(piece)
        if self.pending_bytes[b] >= self.limit:
            self._flush(b)

    def _flush(self, b: int) -> None:
        data = memoryview(b"".join(self.pending[b]))
        while data:
            data = data[os.write(self.fds[b], data):]
        self.pending[b] = []
        self.pending_bytes[b] = 0

    def _close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def close(self) -> List[Bucket]:
        try:
            for b in range(len(self.fds)):
                if self.pending_bytes[b]:
                    self._flush(b)
        finally:
            self._close_fds()
        return self.buckets


def _scatter(blocks, directory: str, buckets: int, rng: np.random.Generator) -> List[Bucket]:
    """Send every record to a bucket file chosen uniformly at random."""
    files = _BucketFiles(directory, buckets)
    try:
        for block in blocks:
            records = _records_of(block)
            choice = rng.integers(0, buckets, size=len(records), dtype=np.uint16)  # radix sort
            grouped = _pick(records, np.argsort(choice, kind="stable"))
            pos = 0
            for b, n in enumerate(np.bincount(choice, minlength=buckets).tolist()):
                if n:
                    files.add(b, b"\n".join(grouped[pos:pos + n]) + b"\n", n)
                    pos += n
    finally:
        out = files.close()
    return out


def _estimate_records(sources: Sequence[Source], total: int) -> int:
    """Records in the input, from the line length of its first 64 KiB (to size the buckets so
    that few need a second scatter)."""
    src = next((s for s in sources if s.data_bytes), None)
    if src is None:
        return 0
    with open(src.path, "rb") as f:
        f.seek(src.data_start)
        sample = f.read(tuning.SNIFF)
    return int(total * (sample.count(b"\n") + 1) / max(1, len(sample)))


def _bucket_count(nbytes: int, records: int) -> int:
    need = max(nbytes / (tuning.BUCKET_MAX_BYTES / 2), records / (tuning.BUCKET_MAX_RECORDS / 2))
    return int(min(tuning.MAX_BUCKETS, max(1, np.ceil(need))))


def _emit_bucket(bucket: Bucket, rng: np.random.Generator, sink: "ShuffleSink") -> None:
    """Shuffle one bucket in memory, or scatter it again when it came out too big."""
    if bucket.records > 1 and (bucket.bytes > tuning.BUCKET_MAX_BYTES
                                or bucket.records > tuning.BUCKET_MAX_RECORDS):
        sub_dir = bucket.path + ".d"
        blocks = _whole_record_blocks(bucket.path, 0, tuning.SCATTER_BLOCK, Progress())
        subs = _scatter(blocks, sub_dir, max(2, _bucket_count(bucket.bytes, bucket.records)),
                        rng)
        os.unlink(bucket.path)
        for sub in subs:
            _emit_bucket(sub, rng, sink)
        os.rmdir(sub_dir)
        return
    with open(bucket.path, "rb") as f:
        records = _records_of(f.read())
    os.unlink(bucket.path)
    sink.write_records(_pick(records, rng.permutation(len(records))))


class ShuffleSink:
    """Writes shuffled records into shard after shard, each holding its planned count."""

    def __init__(self, make_writer: Callable[[int], ShardWriter], counts: Sequence[int]):
        self.make_writer = make_writer
        self.counts = list(counts)
        self.writers: List[ShardWriter] = [make_writer(0)]
        self.left = self.counts[0]

    def write_records(self, records: list) -> None:
        pos = 0
        while pos < len(records):
            take = min(self.left, len(records) - pos, tuning.JOIN_RECORDS)
            self.writers[-1].write(b"\n".join(records[pos:pos + take]) + b"\n")
            pos += take
            self.left -= take
            if self.left == 0:
                self.writers[-1].close()
                index = len(self.writers)
                if index == len(self.counts):
                    return                      # --equalize truncate: the rest is dropped
                self.left = self.counts[index]
                self.writers.append(self.make_writer(index))


def shuffle_shards(sources: Sequence[Source], opts: ShardOptions, work_dir: str,
                   make_writer: Callable[[int], ShardWriter], progress: Progress,
                   rng: np.random.Generator) -> List[ShardWriter]:
    """External shuffle: scatter records into random buckets, shuffle each bucket in memory,
    cut the result into shards of equal record counts (+-1)."""
    total = sum(s.data_bytes for s in sources)
    progress.stage("shuffling", total)
    blocks = (block for src in sources
              for block in _whole_record_blocks(src.path, src.data_start, tuning.SCATTER_BLOCK, progress))
    buckets = _scatter(blocks, os.path.join(work_dir, "shuffle"),
                       _bucket_count(total, _estimate_records(sources, total)), rng)
    records = sum(b.records for b in buckets)
    n = opts.trainers
    if records < n:
        raise UsageError(f"{n} {opts.count_flag[2:]} but only {records} record(s) in the input",
                         f"pass {opts.count_flag} {max(1, records)} or fewer")
    base, extra = divmod(records, n)
    counts = [base] * n if opts.equalize == "truncate" else [base + (i < extra) for i in range(n)]
    progress.stage("writing shards", sum(b.bytes for b in buckets))
    sink = ShuffleSink(make_writer, counts)
    try:
        for bucket in buckets:
            _emit_bucket(bucket, rng, sink)
    finally:
        for writer in sink.writers:
            writer.close()
    return sink.writers
