"""What the caller asks for (ShardOptions), what it hears back (Progress, ShardResult), and the
check that the options make sense before any file is touched."""
from __future__ import annotations

from collections import namedtuple

from fluidctl.errors import UsageError
from fluidctl.errors import check_range
from fluidctl import digest
from fluidctl.shardlayout import FORMATS


BY_CHOICES = ("lines", "files")
EQUALIZE_CHOICES = ("none", "pad", "truncate")
CHECKSUM_CHOICES = (*digest.ALGORITHMS, "none")   # the default, digest.DEFAULT, first
MAX_SUFFIX_LENGTH = 20          # 10**20 shards: more than any file system holds


# collections.namedtuple, not typing.NamedTuple or dataclasses: typing (which imports re) and a
# dataclass's definition cost start-up, and shard-data's start-up is part of its speed.
class ShardOptions(namedtuple("ShardOptions", (
        "inputs", "trainers", "out_dir", "by", "format", "shuffle", "seed", "name",
        "suffix_length", "equalize", "checksum", "force", "canonical"),
        defaults=("lines", "text", False, 0, None, 5, "none", digest.DEFAULT, False, False))):
    """inputs (paths), trainers (the shard count), out_dir; by 'lines'|'files', format, shuffle
    and seed, name (the shards' base name, None: the input's), suffix_length, equalize
    'none'|'pad'|'truncate', checksum (a digest algorithm or 'none'), force (replace an existing
    out_dir), canonical (--shards: shards read in a global order by any number of trainers,
    not one per trainer)."""
    __slots__ = ()

    @property
    def count_flag(self) -> str:
        """The option that set the shard count, for messages."""
        return "--shards" if self.canonical else "--trainers"


class Progress:
    """What the engine reports; the CLI passes a rich progress bar, tests pass nothing.
    ``advance`` is called from worker threads."""

    def stage(self, description: str, total_bytes: int) -> None:
        pass

    def advance(self, nbytes: int, records: int = 0) -> None:
        pass


class ShardResult(namedtuple("ShardResult", ("index", "file", "records", "bytes", "digest",
                                           "offsets"), defaults=(None,))):
    """One shard written: index, file (name), records, bytes, digest (hex, made by
    ShardOptions.checksum; None with 'none'); offsets: the manifest entry of its record-offset
    index (canonical shards), else None."""
    __slots__ = ()


def check_options(opts: ShardOptions) -> None:
    if opts.trainers < 1:
        raise UsageError(f"{opts.count_flag} must be at least 1, not {opts.trainers}",
                         f"pass {opts.count_flag} 4")
    if opts.canonical and opts.equalize != "none":
        raise UsageError(f"--equalize {opts.equalize} with --shards: canonical shards need no "
                         "equal counts (every rank reads its part of all of them), and pad "
                         "would repeat records", "drop --equalize")
    for value, choices, flag in ((opts.by, BY_CHOICES, "--by"), (opts.format, FORMATS, "--format"),
                                 (opts.equalize, EQUALIZE_CHOICES, "--equalize"),
                                 (opts.checksum, CHECKSUM_CHOICES, "--checksum")):
        if value not in choices:
            raise UsageError(f"{flag} {value!r} is not one of {', '.join(choices)}",
                             f"pass {flag} {choices[0]}")
    check_range("--seed", opts.seed, 0, None, "e.g. --seed 7")
    check_range("--suffix-length", opts.suffix_length, 1, MAX_SUFFIX_LENGTH,
                f"pass --suffix-length {max(1, len(str(opts.trainers - 1)))}")
    if 10 ** opts.suffix_length < opts.trainers:
        raise UsageError(f"--suffix-length {opts.suffix_length} cannot number {opts.trainers} shards",
                         f"pass --suffix-length {max(1, len(str(opts.trainers - 1)))} or more")
    if opts.name is not None and (not opts.name or "/" in opts.name or opts.name.startswith(".")):
        raise UsageError(f"--name {opts.name!r} is not a plain file name",
                         "pass a name like --name train.txt")
    if opts.checksum != "none":
        try:
            digest.new(opts.checksum)
        except digest.UnknownAlgorithm as exc:
            raise UsageError(f"--checksum {opts.checksum}: {exc}",
                             f"pass --checksum {digest.DEFAULT}") from None
    if opts.shuffle and opts.by == "files":
        raise UsageError("--shuffle shuffles records, which --by files keeps whole",
                         "use --by lines --shuffle")
