"""The ``fluidctl shard-data`` engine: one shard per trainer, at the speed of the disk.

Pure of click and rich (the command wraps it). How it stays fast and small:

* ``--by lines`` / ``--by files`` never pass the data through Python objects. Cut points are
  found by reading only around them; every shard is then a list of byte ranges of the inputs
  (:class:`Segment`), copied by the kernel with ``os.copy_file_range`` (falling back to
  ``os.sendfile``, then to plain writes). Each range is also read once through a reused 1 MiB
  buffer for the manifest's record count (numpy, GIL released) and sha256 (hashlib, GIL
  released); shards are written by one thread per core. ``--checksum none`` skips the sha256.
* Gzip inputs are decompressed once into a spool file inside the staging directory and then
  take the same byte-range path; the spool is deleted before the output appears.
* ``--shuffle`` is an external shuffle (records scattered into random bucket files, then each
  bucket shuffled in memory; a bucket that comes out too big is scattered again), so memory
  stays bounded whatever the input size. Shards then get equal record counts (+-1).
* ``--equalize truncate`` counts records per shard first and cuts the ranges; ``pad`` appends
  records re-sampled (seeded) from the shard itself after it is written, extending its sha256.
* Output is built in a hidden staging directory next to OUT_DIR and renamed into place at the
  end; on any error (bad input, disk full, Ctrl-C) the staging directory is removed.
"""
from __future__ import annotations

import bisect
import errno
import glob
import hashlib
import heapq
import json
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# numpy's BLAS threads would only compete with the copy threads for cores: none is used here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from fluidctl import __version__
from fluidctl.errors import FluidctlError, UsageError
from fluidctl.runtime.data import FORMATS, MANIFEST_NAME, MANIFEST_VERSION, shard_name

BY_CHOICES = ("lines", "files")
EQUALIZE_CHOICES = ("none", "pad", "truncate")
CHECKSUM_CHOICES = ("sha256", "none")

BLOCK = 1 << 20                    # read buffer per worker thread
SNIFF = 64 << 10                   # bytes looked at to decide "binary"; newline search step
GZIP_MAGIC = b"\x1f\x8b"
NEWLINE = 10
BUCKET_MAX_BYTES = 4 << 20         # a shuffle bucket is shuffled in memory up to this size...
BUCKET_MAX_RECORDS = 128 << 10     # ...and this many records; beyond, it is scattered again
MAX_BUCKETS = 512                  # bucket files per scatter level (ids fit numpy's uint16)
SCATTER_BLOCK = 256 << 10          # input read per scatter step (Python objects: ~8x this)
SCATTER_BUFFER = 4 << 20           # buffered bucket bytes, all buckets together
JOIN_RECORDS = 8192                # records joined per write into a shard


# ---------------------------------------------------------------------------------------------
# options, progress, results
# ---------------------------------------------------------------------------------------------
@dataclass
class ShardOptions:
    inputs: Sequence[str]
    trainers: int
    out_dir: str
    by: str = "lines"
    format: str = "text"
    shuffle: bool = False
    seed: int = 0
    name: Optional[str] = None
    suffix_length: int = 5
    equalize: str = "none"
    checksum: str = "sha256"
    force: bool = False


class Progress:
    """What the engine reports; the CLI passes a rich progress bar, tests pass nothing.
    ``advance`` is called from worker threads."""

    def stage(self, description: str, total_bytes: int) -> None:
        pass

    def advance(self, nbytes: int, records: int = 0) -> None:
        pass


@dataclass
class ShardResult:
    index: int
    file: str
    records: int
    bytes: int
    sha256: Optional[str]


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
@dataclass
class Source:
    """One input file as the engine reads it (``path`` is a decompressed spool for gzip)."""
    display: str                   # what the user named (for messages and the manifest)
    path: str                      # what is read
    input_bytes: int               # size on disk of the original
    gzip: bool = False
    size: int = 0                  # bytes of ``path``
    data_start: int = 0            # after the CSV header
    header: bytes = b""
    ends_with_newline: bool = True

    @property
    def data_bytes(self) -> int:
        return self.size - self.data_start


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def resolve_inputs(args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """INPUT arguments -> (files in order, directories named). Directories give every file
    below them (hidden ones skipped) in sorted order; globs are expanded and sorted."""
    if not args:
        raise UsageError("no input given", "pass files, directories or globs: shard-data train.txt")
    files: List[str] = []
    dirs: List[str] = []
    for arg in args:
        if os.path.isdir(arg):
            dirs.append(arg)
            found = []
            for root, subdirs, names in os.walk(arg):
                subdirs[:] = sorted(d for d in subdirs if not _is_hidden(d))
                found.extend(os.path.join(root, n) for n in names if not _is_hidden(n))
            found = sorted(p for p in found if os.path.isfile(p))
            if not found:
                raise UsageError(f"directory {arg} has no files",
                                 "put data files in it or name the files instead")
            files.extend(found)
        elif os.path.exists(arg):
            if not os.path.isfile(arg):
                raise UsageError(f"input {arg} is not a regular file",
                                 "pass data files, directories or globs")
            files.append(arg)
        elif glob.has_magic(arg):
            matches = sorted(p for p in glob.glob(arg, recursive=True) if os.path.isfile(p))
            if not matches:
                raise UsageError(f"no file matches {arg}", "check the pattern (quote it)")
            files.extend(matches)
        else:
            raise UsageError(f"input {arg} does not exist", "check the path")
    seen: Dict[str, str] = {}
    for path in files:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"input {path} is given twice (also as {seen[real]})",
                             "name each file once")
        seen[real] = path
    return files, dirs


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def check_out_dir(out_dir: str, files: Sequence[str], dirs: Sequence[str], force: bool) -> None:
    for d in dirs:
        if _inside(out_dir, d):
            raise UsageError(f"output {out_dir} is inside input directory {d}",
                             "choose an -o outside the inputs")
    for f in files:
        if _inside(f, out_dir):
            raise UsageError(f"input {f} is inside the output {out_dir}",
                             "choose an -o that holds none of the inputs")
    if os.path.lexists(out_dir):
        if not os.path.isdir(out_dir):
            raise UsageError(f"output {out_dir} exists and is not a directory",
                             "choose another -o")
        if not force:
            raise UsageError(f"output {out_dir} already exists",
                             "pass --force to replace it, or choose another -o")


def _sniff_binary(head: bytes, display: str) -> None:
    at = head[:SNIFF].find(b"\0")
    if at >= 0:
        raise UsageError(f"{display} looks binary (NUL byte at offset {at})",
                         "shard-data reads text: one record per line, CSV or JSON Lines")


def _spool_gzip(src: str, dest: str, progress: Progress) -> None:
    import gzip
    import zlib
    try:
        with open(src, "rb") as raw, gzip.GzipFile(fileobj=raw) as fin, \
                open(dest, "wb") as fout:
            buf = bytearray(BLOCK)
            done = 0
            while True:
                n = fin.readinto(buf)
                if not n:
                    break
                if done == 0:
                    _sniff_binary(bytes(buf[:n]), src)
                fout.write(memoryview(buf)[:n])
                progress.advance(raw.tell() - done)
                done = raw.tell()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise UsageError(f"{src} is not a valid gzip file ({exc})",
                         "check the file or decompress it first") from None


def open_sources(files: Sequence[str], fmt: str, spool_dir: str,
                 progress: Progress) -> List[Source]:
    """Stat and sniff every input (before any long work), decompress gzip ones, read CSV
    headers."""
    sources = []
    gz = []
    for i, path in enumerate(files):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(SNIFF)
        src = Source(display=path, path=path, input_bytes=size, size=size)
        if head[:2] == GZIP_MAGIC:
            src.gzip = True
            src.path = os.path.join(spool_dir, f"spool-{i:06d}")
            gz.append(src)
        else:
            _sniff_binary(head, path)
        sources.append(src)
    if gz:
        progress.stage("decompressing", sum(s.input_bytes for s in gz))
        for src in gz:
            _spool_gzip(src.display, src.path, progress)
    for src in sources:
        src.size = os.path.getsize(src.path)
        with open(src.path, "rb") as f:
            if fmt == "csv":
                src.header = f.readline(BLOCK)
                src.data_start = len(src.header)
                if src.header and not src.header.endswith(b"\n"):
                    src.header += b"\n"
            if src.size > src.data_start:
                f.seek(src.size - 1)
                src.ends_with_newline = f.read(1) == b"\n"
    if fmt == "csv":
        _check_csv_headers(sources)
    return sources


def _check_csv_headers(sources: Sequence[Source]) -> None:
    first = sources[0]
    if not first.header.strip():
        raise UsageError(f"CSV input {first.display} has no header line",
                         "add a header line, or use --format text")
    for src in sources[1:]:
        if src.header.rstrip(b"\r\n") != first.header.rstrip(b"\r\n"):
            raise UsageError(
                f"CSV header of {src.display} ({_short(src.header)}) differs from "
                f"{first.display} ({_short(first.header)})",
                "shard files with the same columns together")


def _short(line: bytes, limit: int = 60) -> str:
    text = line.rstrip(b"\r\n").decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."


def validate_jsonl(sources: Sequence[Source], progress: Progress) -> None:
    """Every record must parse; the first that does not is named with its line number."""
    progress.stage("checking JSON", sum(s.data_bytes for s in sources))
    for src in sources:
        with open(src.path, "rb", buffering=BLOCK) as f:
            done = 0
            for lineno, line in enumerate(f, start=1):
                try:
                    json.loads(line)
                except ValueError as exc:
                    raise UsageError(f"{src.display}:{lineno}: not valid JSON ({exc})",
                                     "fix or remove that line, or use --format text") from None
                done += len(line)
                if done >= BLOCK:
                    progress.advance(done)
                    done = 0
            progress.advance(done)


# ---------------------------------------------------------------------------------------------
# the logical stream and its byte ranges
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """A piece of a shard: bytes [start, end) of source ``src``, or literal ``data``."""
    src: int = -1
    start: int = 0
    end: int = 0
    data: bytes = b""

    @property
    def length(self) -> int:
        return len(self.data) if self.src < 0 else self.end - self.start


@dataclass
class Span:
    """The records of one source in the logical stream: file bytes [start, end), plus a newline
    the file lacks when another file follows it (so two records never merge)."""
    src: int
    start: int
    end: int
    add_newline: bool

    @property
    def length(self) -> int:
        return self.end - self.start + (1 if self.add_newline else 0)


def make_spans(sources: Sequence[Source]) -> List[Span]:
    spans = []
    last = max((i for i, s in enumerate(sources) if s.data_bytes > 0), default=-1)
    for i, src in enumerate(sources):
        if src.data_bytes > 0:
            spans.append(Span(i, src.data_start, src.size,
                              add_newline=not src.ends_with_newline and i != last))
    return spans


def find_newline(path: str, start: int, end: int) -> int:
    """Offset of the first newline in bytes [start, end) of a file, or -1; reads 64 KiB at a
    time, so finding a cut costs a few KiB of reading."""
    with open(path, "rb", buffering=0) as f:
        pos = start
        while pos < end:
            f.seek(pos)
            chunk = f.read(min(SNIFF, end - pos))
            if not chunk:
                break
            at = chunk.find(b"\n")
            if at >= 0:
                return pos + at
            pos += len(chunk)
    return -1


def rfind_newline(path: str, start: int, end: int) -> int:
    """Offset of the last newline in bytes [start, end) of a file, or -1."""
    with open(path, "rb", buffering=0) as f:
        hi = end
        while hi > start:
            lo = max(start, hi - SNIFF)
            f.seek(lo)
            at = f.read(hi - lo).rfind(b"\n")
            if at >= 0:
                return lo + at
            hi = lo
    return -1


class Stream:
    """The concatenated records of all inputs, addressed by logical offset; reads only what a
    question needs (cut points look at a few KiB around each target)."""

    def __init__(self, sources: Sequence[Source], spans: Sequence[Span]):
        self.sources = sources
        self.spans = list(spans)
        self.offsets = [0]
        for span in self.spans:
            self.offsets.append(self.offsets[-1] + span.length)
        self.length = self.offsets[-1]

    def _span_at(self, pos: int, right: bool) -> int:
        if right:   # span with offsets[k] <= pos < offsets[k+1]
            return bisect.bisect_right(self.offsets, pos) - 1
        return bisect.bisect_left(self.offsets, pos) - 1   # offsets[k] < pos <= offsets[k+1]

    def next_boundary(self, target: int) -> int:
        """The first record boundary at or after ``target``."""
        if target >= self.length:
            return self.length
        k = self._span_at(target, right=True)
        span, base = self.spans[k], self.offsets[k]
        local = target - base
        if local == 0:
            return target
        at = find_newline(self.sources[span.src].path, span.start + local - 1, span.end)
        return base + at - span.start + 1 if at >= 0 else self.offsets[k + 1]

    def prev_start(self, boundary: int) -> int:
        """The start of the record that ends at ``boundary``."""
        k = self._span_at(boundary, right=False)
        span, base = self.spans[k], self.offsets[k]
        local = boundary - base
        size = span.end - span.start
        src = self.sources[span.src]
        if local > size or (local == size and not src.ends_with_newline):
            search_end = span.end                       # record ends at the file's end
        else:
            search_end = span.start + local - 1         # skip the record's own newline
        at = rfind_newline(src.path, span.start, search_end)
        return base + at - span.start + 1 if at >= 0 else base

    def segments(self, a: int, b: int) -> List[Segment]:
        """Logical range [a, b) as byte ranges of the sources (and added newlines)."""
        out = []
        for k, span in enumerate(self.spans):
            base = self.offsets[k]
            size = span.end - span.start
            lo, hi = max(a, base), min(b, base + size)
            if lo < hi:
                out.append(Segment(span.src, span.start + lo - base, span.start + hi - base))
            if span.add_newline and a <= base + size < b:
                out.append(Segment(data=b"\n"))
        return out

    def count_records(self, limit: int) -> int:
        """Records in the whole stream, counting no further than ``limit``."""
        count = 0
        for span in self.spans:
            count += _count_range(self.sources[span.src].path, span.start, span.end, limit - count)
            if count >= limit:
                return count
            src = self.sources[span.src]
            if not src.ends_with_newline and span.end == src.size:
                count += 1
        return count


def _count_range(path: str, start: int, end: int, limit: int) -> int:
    buf = bytearray(BLOCK)
    arr = np.frombuffer(buf, np.uint8)
    count = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end and count < limit:
            n = os.preadv(fd, [memoryview(buf)[:min(BLOCK, end - start)]], start)
            if n <= 0:
                break
            count += int(np.count_nonzero(arr[:n] == NEWLINE))
            start += n
    finally:
        os.close(fd)
    return count


def plan_lines(stream: Stream, trainers: int) -> List[List[Segment]]:
    """Contiguous shards of about 1/N of the bytes each, cut at record boundaries, each holding
    at least one record."""
    total = stream.length
    cuts = [0] * (trainers + 1)
    cuts[trainers] = total
    if trainers > total:                    # a record has at least one byte
        cuts = [0] * (trainers + 1)
    else:
        _place_cuts(stream, cuts)
    if any(cuts[i] >= cuts[i + 1] for i in range(trainers)):
        records = stream.count_records(trainers)
        raise UsageError(f"{trainers} trainers but only {records} record(s) in the input",
                         f"pass --trainers {max(1, records)} or fewer")
    return [stream.segments(cuts[i], cuts[i + 1]) for i in range(trainers)]


def _place_cuts(stream: Stream, cuts: List[int]) -> None:
    """cuts[1..N-1] at the first record boundary after i/N of the bytes; then moved so that
    every shard holds a record (forward: at least one after the previous cut; backward: a
    record longer than 1/N must not leave the shards after it empty)."""
    trainers, total = len(cuts) - 1, stream.length
    for i in range(1, trainers):
        c = stream.next_boundary(i * total // trainers)
        if c <= cuts[i - 1] and cuts[i - 1] < total:
            c = stream.next_boundary(cuts[i - 1] + 1)
        cuts[i] = min(c, total)
    for i in range(trainers - 1, 0, -1):
        if cuts[i] >= cuts[i + 1]:
            cuts[i] = stream.prev_start(cuts[i + 1]) if cuts[i + 1] > 0 else 0


def plan_files(stream: Stream, sources: Sequence[Source], trainers: int) -> List[List[Segment]]:
    """Whole files to shards, largest first onto the lightest shard; a shard keeps its files in
    input order."""
    if len(stream.spans) < trainers:
        raise UsageError(f"{trainers} trainers but only {len(stream.spans)} non-empty input file(s)",
                         "use --by lines, or fewer --trainers")
    lightest = [(0, i) for i in range(trainers)]       # heap of (bytes, shard)
    owner: Dict[int, int] = {}
    for k in sorted(range(len(stream.spans)), key=lambda k: (-stream.spans[k].length, k)):
        load, target = heapq.heappop(lightest)
        owner[k] = target
        heapq.heappush(lightest, (load + stream.spans[k].length, target))
    plans: List[List[Segment]] = [[] for _ in range(trainers)]
    for k, span in enumerate(stream.spans):
        segs = plans[owner[k]]
        if segs and segs[-1].src >= 0 and not sources[segs[-1].src].ends_with_newline:
            segs.append(Segment(data=b"\n"))
        segs.append(Segment(span.src, span.start, span.end))
    return plans


# ---------------------------------------------------------------------------------------------
# copying byte ranges: kernel copy, with a read pass for the record count and sha256
# ---------------------------------------------------------------------------------------------
_FALLBACK_ERRNOS = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF,
                    errno.ETXTBSY, errno.EPERM}


class Copier:
    """Copies file ranges with the fastest call the two file systems allow; remembers a refusal
    so a fallback is tried once, not per chunk."""

    first_choice = "copy_file_range"        # then "sendfile", then "write"

    def __init__(self):
        self.mode = self.first_choice
        if self.mode == "copy_file_range" and not hasattr(os, "copy_file_range"):
            self.mode = "sendfile"
        self._lock = threading.Lock()

    def _downgrade(self, failed: str) -> None:
        with self._lock:
            if self.mode == failed:
                self.mode = "sendfile" if failed == "copy_file_range" else "write"

    def copy(self, fin: int, fout: int, offset: int, count: int, buffer: Optional[memoryview]):
        """Copy ``count`` bytes at ``offset`` of ``fin`` to ``fout``'s position. ``buffer``, when
        given, already holds those bytes (read for hashing): the plain-write fallback uses it."""
        while count > 0:
            mode = self.mode
            try:
                if mode == "copy_file_range":
                    n = os.copy_file_range(fin, fout, count, offset)
                elif mode == "sendfile":
                    n = os.sendfile(fout, fin, offset, count)
                else:
                    if buffer is None:
                        buffer = memoryview(os.pread(fin, count, offset))
                    n = os.write(fout, buffer[:count])
            except OSError as exc:
                if mode != "write" and exc.errno in _FALLBACK_ERRNOS:
                    self._downgrade(mode)
                    continue
                raise
            if n == 0:
                raise UsageError("an input file shrank while being sharded",
                                 "do not modify the inputs while shard-data runs")
            offset += n
            count -= n
            if buffer is not None:
                buffer = buffer[n:]


class ShardWriter:
    """One output shard: bytes appended through here are counted (records) and hashed."""

    def __init__(self, path: str, checksum: str, progress: Progress):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.hasher = hashlib.sha256() if checksum == "sha256" else None
        self.progress = progress
        self.bytes = 0
        self.newlines = 0
        self.last_byte = NEWLINE
        # (start, end, newlines) of every piece written: --equalize pad finds records from
        # these counts and reads only the pieces its picks fall in.
        self.pieces: List[Tuple[int, int, int]] = []

    def _account(self, data: memoryview, arr: Optional[np.ndarray]) -> None:
        n = len(data)
        if not n:
            return
        if self.hasher is not None:
            self.hasher.update(data)
        arr = np.frombuffer(data, np.uint8) if arr is None else arr
        new = int(np.count_nonzero(arr == NEWLINE))
        self.newlines += new
        self.last_byte = data[n - 1]
        self.pieces.append((self.bytes, self.bytes + n, new))
        self.bytes += n
        self.progress.advance(n, new)

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self._account(view, None)
        while view:
            view = view[os.write(self.fd, view):]

    def copy_range(self, copier: Copier, path: str, start: int, end: int,
                   stop: threading.Event) -> None:
        """Append bytes [start, end) of ``path``: each 1 MiB is read once for the count and
        sha256 (from the page cache) and copied by the kernel."""
        buf = bytearray(BLOCK)
        arr = np.frombuffer(buf, np.uint8)
        fin = os.open(path, os.O_RDONLY)
        try:
            pos = start
            while pos < end:
                if stop.is_set():
                    raise _Stopped()
                n = min(BLOCK, end - pos)
                if os.preadv(fin, [memoryview(buf)[:n]], pos) != n:
                    raise UsageError(f"input {path} shrank while being sharded",
                                     "do not modify the inputs while shard-data runs")
                view = memoryview(buf)[:n]
                self._account(view, arr[:n])
                copier.copy(fin, self.fd, pos, n, view)
                pos += n
        finally:
            os.close(fin)

    @property
    def records(self) -> int:
        return self.newlines + (1 if self.bytes and self.last_byte != NEWLINE else 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def sha256(self) -> Optional[str]:
        return self.hasher.hexdigest() if self.hasher is not None else None


class _Stopped(Exception):
    """Another worker failed: stop copying."""


def _offset_after_newline(path: str, start: int, end: int, j: int) -> int:
    """The offset just past the j-th newline (0-based) in bytes [start, end) of a file (which
    has more than j newlines there)."""
    buf = bytearray(BLOCK)
    arr = np.frombuffer(buf, np.uint8)
    seen = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            n = os.preadv(fd, [memoryview(buf)[:min(BLOCK, end - pos)]], pos)
            if n <= 0:
                break
            is_newline = arr[:n] == NEWLINE
            count = int(np.count_nonzero(is_newline))
            if seen + count > j:
                return pos + int(np.flatnonzero(is_newline)[j - seen]) + 1
            seen += count
            pos += n
    finally:
        os.close(fd)
    raise ValueError(f"{path} has only {seen} newlines in [{start}, {end})")


def truncate_plan(sources: Sequence[Source], plan: List[Segment], keep: int) -> List[Segment]:
    """The first ``keep`` records of a shard's segments (which hold more than that)."""
    out: List[Segment] = []
    remaining = keep
    for seg in plan:
        if remaining == 0:
            break
        if seg.src < 0:
            out.append(seg)
            remaining -= seg.data.count(b"\n")
            continue
        path = sources[seg.src].path
        here = _count_range(path, seg.start, seg.end, 1 << 62)
        if here < remaining:
            out.append(seg)
            remaining -= here
            continue
        end = _offset_after_newline(path, seg.start, seg.end, remaining - 1)
        out.append(Segment(seg.src, seg.start, end))
        remaining = 0
    return out


def count_plan(sources: Sequence[Source], plan: List[Segment]) -> int:
    newlines, last = 0, NEWLINE
    size = 0
    for seg in plan:
        if seg.src < 0:
            newlines += seg.data.count(b"\n")
            last = seg.data[-1] if seg.data else last
        else:
            path = sources[seg.src].path
            newlines += _count_range(path, seg.start, seg.end, 1 << 62)
            with open(path, "rb") as f:
                f.seek(seg.end - 1)
                last = f.read(1)[0]
        size += seg.length
    return newlines + (1 if size and last != NEWLINE else 0)


def _picks_here(rng: np.random.Generator, here: int, later: int, picks: int) -> int:
    """How many of ``picks`` records drawn without replacement from ``here + later`` fall among
    the first ``here``: hypergeometric (binomial beyond numpy's 10**9 limit, clamped so the
    rest still fit in ``later``)."""
    if later == 0:
        return picks
    if here + later < 10 ** 9:
        return int(rng.hypergeometric(here, later, picks))
    drawn = int(rng.binomial(picks, here / (here + later)))
    return max(picks - later, min(here, drawn))


def pad_shard(writer: ShardWriter, header_lines: int, extra: int,
              rng: np.random.Generator, progress: Progress) -> None:
    """Append ``extra`` records re-sampled from the shard itself, continuing its count and
    sha256. Without replacement: when ``extra`` exceeds the shard's records, every record is
    first repeated ``extra // records`` times, then the rest are sampled.

    How many picks fall in each written piece is drawn from the hypergeometric law using the
    piece's newline count, so only pieces holding picks are read, and the picks are never all
    in memory at once."""
    records = writer.records - header_lines
    if extra <= 0 or records <= 0:
        return
    if writer.last_byte != NEWLINE:
        writer.write(b"\n")
    size, pieces = writer.bytes, list(writer.pieces)
    copies, picks_left = divmod(extra, records)
    if copies:
        data_start = 0
        if header_lines:
            data_start = _offset_after_newline(writer.path, 0, size, header_lines - 1)
        copier = Copier()
        for _ in range(copies):
            writer.copy_range(copier, writer.path, data_start, size, threading.Event())
    records_left = records
    line = 0                                  # index of the first line ending in this piece
    fd = os.open(writer.path, os.O_RDONLY)
    try:
        for start, end, newlines in pieces:
            first = max(line, header_lines)   # first record (not header) ending here
            here_records = line + newlines - first
            line += newlines
            if here_records <= 0 or picks_left == 0:
                records_left -= max(0, here_records)
                continue
            here = _picks_here(rng, here_records, records_left - here_records, picks_left)
            records_left -= here_records
            if not here:
                continue
            data = os.pread(fd, end - start, start)
            progress.advance(len(data))
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == NEWLINE) + 1
            chosen = np.sort(rng.choice(here_records, size=here, replace=False))
            chosen += first - (line - newlines)
            added = []
            for k in chosen.tolist():
                e = int(ends[k])
                if k:
                    added.append(data[int(ends[k - 1]):e])
                else:                         # starts in an earlier piece
                    s = rfind_newline(writer.path, 0, start) + 1
                    added.append(os.pread(fd, start + e - s, s))
            writer.write(b"".join(added))
            picks_left -= here
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# external shuffle
# ---------------------------------------------------------------------------------------------
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
        carry = b""
        while left > 0:
            chunk = f.read(min(block, left))
            left -= len(chunk)
            if not chunk:
                break
            progress.advance(len(chunk))
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                yield data[:cut] if carry else data
        if carry:
            yield carry + b"\n"


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
        self.limit = max(4096, SCATTER_BUFFER // count)
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
        sample = f.read(SNIFF)
    return int(total * (sample.count(b"\n") + 1) / max(1, len(sample)))


def _bucket_count(nbytes: int, records: int) -> int:
    need = max(nbytes / (BUCKET_MAX_BYTES / 2), records / (BUCKET_MAX_RECORDS / 2))
    return int(min(MAX_BUCKETS, max(1, np.ceil(need))))


def _emit_bucket(bucket: Bucket, rng: np.random.Generator, sink: "ShuffleSink") -> None:
    """Shuffle one bucket in memory, or scatter it again when it came out too big."""
    if bucket.records > 1 and (bucket.bytes > BUCKET_MAX_BYTES
                                or bucket.records > BUCKET_MAX_RECORDS):
        sub_dir = bucket.path + ".d"
        blocks = _whole_record_blocks(bucket.path, 0, SCATTER_BLOCK, Progress())
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
            take = min(self.left, len(records) - pos, JOIN_RECORDS)
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
              for block in _whole_record_blocks(src.path, src.data_start, SCATTER_BLOCK, progress))
    buckets = _scatter(blocks, os.path.join(work_dir, "shuffle"),
                       _bucket_count(total, _estimate_records(sources, total)), rng)
    records = sum(b.records for b in buckets)
    n = opts.trainers
    if records < n:
        raise UsageError(f"{n} trainers but only {records} record(s) in the input",
                         f"pass --trainers {max(1, records)} or fewer")
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


# ---------------------------------------------------------------------------------------------
# staging: nothing half-written
# ---------------------------------------------------------------------------------------------
class Staging:
    """A hidden directory next to OUT_DIR that becomes OUT_DIR at the end, or disappears."""

    def __init__(self, out_dir: str):
        self.out_dir = os.path.abspath(out_dir)
        self.tmp = ""
        self.created: List[str] = []
        self.committed = False

    def __enter__(self) -> "Staging":
        parent = os.path.dirname(self.out_dir)
        missing = []
        p = parent
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        try:
            for d in reversed(missing):
                os.mkdir(d)
                self.created.append(d)
            self.tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(self.out_dir)}.",
                                        suffix=".partial", dir=parent)
        except OSError as exc:
            self._cleanup()
            raise UsageError(f"cannot write the output {self.out_dir}: {exc.strerror}",
                             "choose a writable -o") from None
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(self.tmp, 0o777 & ~mask)
        self.work = os.path.join(self.tmp, ".work")
        os.mkdir(self.work)
        return self

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def commit(self) -> None:
        shutil.rmtree(self.work)
        old = None
        if os.path.lexists(self.out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(self.out_dir)}.", suffix=".old",
                                   dir=os.path.dirname(self.out_dir))
            os.rename(self.out_dir, os.path.join(old, "previous"))
        os.rename(self.tmp, self.out_dir)
        self.committed = True
        if old:
            shutil.rmtree(old, ignore_errors=True)

    def _cleanup(self) -> None:
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for d in reversed(self.created):
            try:
                os.rmdir(d)
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self._cleanup()


def _io_error(exc: OSError, out_dir: str, staging: str) -> FluidctlError:
    """An OSError met while sharding, as one line: disk full, unwritable output and unreadable
    input are the user's to fix (exit 2); anything else is reported with its file (exit 1)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(f"disk full while writing {out_dir}",
                          "free some space or choose another -o")
    writing = not exc.filename or _inside(str(exc.filename), staging)
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        if writing:
            return UsageError(f"cannot write {out_dir}: {exc.strerror}", "choose a writable -o")
        return UsageError(f"cannot read {exc.filename}: {exc.strerror}",
                          "check the input's permissions")
    return FluidctlError(f"{exc.filename or out_dir}: {exc.strerror or exc}",
                         "check the disk and the inputs", exit_code=1)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _check_space(directory: str, out_dir: str, needed: int) -> None:
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < needed:
        raise UsageError(
            f"not enough space for {out_dir}: {_human(needed)} needed, "
            f"{_human(st.f_bavail * st.f_frsize)} free", "free some space or choose another -o")


# ---------------------------------------------------------------------------------------------
# the whole command
# ---------------------------------------------------------------------------------------------
def check_options(opts: ShardOptions) -> None:
    if opts.trainers < 1:
        raise UsageError(f"--trainers must be at least 1, not {opts.trainers}",
                         "pass --trainers 4")
    for value, choices, flag in ((opts.by, BY_CHOICES, "--by"), (opts.format, FORMATS, "--format"),
                                 (opts.equalize, EQUALIZE_CHOICES, "--equalize"),
                                 (opts.checksum, CHECKSUM_CHOICES, "--checksum")):
        if value not in choices:
            raise UsageError(f"{flag} {value!r} is not one of {', '.join(choices)}",
                             f"pass {flag} {choices[0]}")
    if opts.suffix_length < 1 or 10 ** opts.suffix_length < opts.trainers:
        raise UsageError(f"--suffix-length {opts.suffix_length} cannot number {opts.trainers} shards",
                         f"pass --suffix-length {max(1, len(str(opts.trainers - 1)))} or more")
    if opts.name is not None and (not opts.name or "/" in opts.name or opts.name.startswith(".")):
        raise UsageError(f"--name {opts.name!r} is not a plain file name",
                         "pass a name like --name train.txt")
    if opts.shuffle and opts.by == "files":
        raise UsageError("--shuffle shuffles records, which --by files keeps whole",
                         "use --by lines --shuffle")


def default_name(first_input: str) -> str:
    name = os.path.basename(first_input.rstrip(os.sep))
    if name.endswith(".gz"):
        name = name[:-3]
    return name or "shard"


def shard(opts: ShardOptions, progress: Optional[Progress] = None) -> dict:
    """Run shard-data; returns the manifest (also written to OUT_DIR/manifest.json)."""
    progress = progress or Progress()
    check_options(opts)
    files, dirs = resolve_inputs(opts.inputs)
    check_out_dir(opts.out_dir, files, dirs, opts.force)
    name = opts.name or default_name(files[0])
    with Staging(opts.out_dir) as stage:
        try:
            sources, results = _build(opts, files, name, stage, progress)
            manifest = _manifest(opts, name, results, sources)
            with open(stage.path(MANIFEST_NAME), "w") as f:     # written last
                json.dump(manifest, f, indent=2)
                f.write("\n")
            stage.commit()
        except OSError as exc:
            raise _io_error(exc, opts.out_dir, stage.tmp) from None
    return manifest


def _build(opts: ShardOptions, files: List[str], name: str, stage: Staging,
           progress: Progress) -> Tuple[List[Source], List[ShardResult]]:
    sources = open_sources(files, opts.format, stage.work, progress)
    if opts.format == "jsonl":
        validate_jsonl(sources, progress)
    header = sources[0].header if opts.format == "csv" else b""
    seeds = np.random.SeedSequence(opts.seed).spawn(2)
    pad_rngs = [np.random.default_rng(s) for s in seeds[1].spawn(opts.trainers)]
    file_names = [shard_name(name, i, opts.suffix_length) for i in range(opts.trainers)]

    def make_writer(i: int) -> ShardWriter:
        writer = ShardWriter(stage.path(file_names[i]), opts.checksum, progress)
        if header:
            writer.write(header)
        return writer

    if opts.shuffle:
        total = sum(s.data_bytes for s in sources)
        _check_space(stage.tmp, opts.out_dir, 2 * total)
        writers = shuffle_shards(sources, opts, stage.work, make_writer, progress,
                                 np.random.default_rng(seeds[0]))
    else:
        stream = Stream(sources, make_spans(sources))
        if opts.by == "lines":
            plans = plan_lines(stream, opts.trainers)
        else:
            plans = plan_files(stream, sources, opts.trainers)
        if opts.equalize == "truncate":
            progress.stage("counting records", stream.length)
            counts = [count_plan(sources, p) for p in plans]
            keep = min(counts)
            plans = [truncate_plan(sources, p, keep) if c > keep else p
                     for p, c in zip(plans, counts)]
        size = sum(s.length for p in plans for s in p) + len(header) * opts.trainers
        _check_space(stage.tmp, opts.out_dir, size)
        writers = _write_plans(plans, sources, make_writer, progress, size)
    header_lines = 1 if header else 0
    if opts.equalize == "pad":
        most = max(w.records for w in writers)
        progress.stage("padding", sum(w.bytes for w in writers if w.records < most))

        def pad(i: int, stop: threading.Event) -> None:
            w = writers[i]
            if w.records < most:
                w.fd = os.open(w.path, os.O_WRONLY)
                os.lseek(w.fd, 0, os.SEEK_END)
                try:
                    pad_shard(w, header_lines, most - w.records, pad_rngs[i], progress)
                finally:
                    w.close()

        _parallel(pad, len(writers))
    return sources, [ShardResult(i, file_names[i], w.records - header_lines, w.bytes, w.sha256)
                     for i, w in enumerate(writers)]


def _parallel(fn: Callable[[int, threading.Event], object], count: int) -> list:
    """``fn(i, stop)`` for every i < count, one thread per core, results in order. The first
    error (or Ctrl-C in the main thread) sets ``stop`` for the others and is raised."""
    stop = threading.Event()

    def guarded(i: int):
        if stop.is_set():
            raise _Stopped()
        try:
            return fn(i, stop)
        except BaseException:
            stop.set()
            raise

    pool = ThreadPoolExecutor(max(1, min(count, os.cpu_count() or 1)),
                              thread_name_prefix="shard-data")
    results, errors = [], []
    try:
        for future in [pool.submit(guarded, i) for i in range(count)]:
            try:
                results.append(future.result())
            except _Stopped:
                pass
            except Exception as exc:      # the first one is raised below
                errors.append(exc)
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        raise errors[0]
    return results


def _write_plans(plans: List[List[Segment]], sources: Sequence[Source],
                 make_writer: Callable[[int], ShardWriter], progress: Progress,
                 size: int) -> List[ShardWriter]:
    """Write every shard from its byte ranges, in parallel."""
    progress.stage("writing shards", size)
    copier = Copier()

    def work(i: int, stop: threading.Event) -> ShardWriter:
        writer = make_writer(i)
        try:
            for seg in plans[i]:
                if seg.src < 0:
                    writer.write(seg.data)
                else:
                    writer.copy_range(copier, sources[seg.src].path, seg.start, seg.end, stop)
        finally:
            writer.close()
        return writer

    return _parallel(work, len(plans))


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
        "shards": [{"index": r.index, "file": r.file, "records": r.records, "bytes": r.bytes,
                    "sha256": r.sha256} for r in results],
    }
    if opts.format == "csv":
        manifest["header"] = _short(sources[0].header, 10_000)
    return manifest
