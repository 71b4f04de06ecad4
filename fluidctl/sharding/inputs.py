"""Finding the inputs (files, directories, globs), checking them and the output against each
other, and opening them: gzip spooled to plain bytes, binary refused, CSV headers compared, JSON
Lines validated -- all before any long work starts."""
from __future__ import annotations

import os

from fluidctl.errors import UsageError
from fluidctl.sharding import tuning
from fluidctl.sharding.options import Progress

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import Dict, List, Sequence, Tuple

GZIP_MAGIC = b"\x1f\x8b"


class Source:
    """One input file as the engine reads it (``path`` is a decompressed spool for gzip).
    A plain class, not a dataclass: see options.ShardOptions."""
    __slots__ = ("display", "path", "input_bytes", "gzip", "size", "data_start", "header",
                 "ends_with_newline")

    def __init__(self, display: str, path: str, input_bytes: int, gzip: bool = False,
                 size: int = 0, data_start: int = 0, header: bytes = b"",
                 ends_with_newline: bool = True):
        self.display = display          # what the user named (for messages and the manifest)
        self.path = path                # what is read
        self.input_bytes = input_bytes  # size on disk of the original
        self.gzip = gzip
        self.size = size                # bytes of ``path``
        self.data_start = data_start    # after the CSV header
        self.header = header
        self.ends_with_newline = ends_with_newline

    def __repr__(self) -> str:
        return f"Source({self.display!r}, size={self.size})"

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
        elif any(c in arg for c in "*?["):            # glob.has_magic, without re
            import glob
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
    at = head[:tuning.SNIFF].find(b"\0")
    if at >= 0:
        raise UsageError(f"{display} looks binary (NUL byte at offset {at})",
                         "shard-data reads text: one record per line, CSV or JSON Lines")


def _spool_gzip(src: str, dest: str, progress: Progress) -> None:
    import gzip
    import zlib
    try:
        with open(src, "rb") as raw, gzip.GzipFile(fileobj=raw) as fin, \
                open(dest, "wb") as fout:
            buf = bytearray(tuning.BLOCK)
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
            head = f.read(tuning.SNIFF)
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
                src.header = f.readline(tuning.BLOCK)
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
    import json                 # here: it imports re, which every other small run is spared
    progress.stage("checking JSON", sum(s.data_bytes for s in sources))
    for src in sources:
        with open(src.path, "rb", buffering=tuning.BLOCK) as f:
            done = 0
            for lineno, line in enumerate(f, start=1):
                try:
                    json.loads(line)
                except ValueError as exc:
                    raise UsageError(f"{src.display}:{lineno}: not valid JSON ({exc})",
                                     "fix or remove that line, or use --format text") from None
                done += len(line)
                if done >= tuning.BLOCK:
                    progress.advance(done)
                    done = 0
            progress.advance(done)


def default_name(first_input: str) -> str:
    name = os.path.basename(first_input.rstrip(os.sep))
    if name.endswith(".gz"):
        name = name[:-3]
    return name or "shard"
