"""``fluidctl shard-data``: options -> ShardOptions -> fluidctl.sharding.shard()."""
from __future__ import annotations

import signal
import sys
import threading

import click

from fluidctl import sharding
from fluidctl.errors import FluidctlError, UsageError
from fluidctl import digest

HELP = """Split INPUT... into one shard per trainer: OUT_DIR/<name>-00000, -00001, ... plus
OUT_DIR/manifest.json (inputs, options, and per shard its file, records, bytes and digest,
xxh3-128 by default, with the name of the algorithm beside it).

INPUT may be files, directories (every file inside, sorted) or globs; gzip files are read
transparently. By default shards are contiguous, in order, about 1/N of the bytes each, cut at
line ends: concatenated they are byte-identical to the input.

NCCL2 (collective) jobs need every trainer to run the same number of steps, or the job stalls
at the last step: pass --equalize pad (or truncate) unless every trainer stops on its own after
a fixed number of batches. Parameter-server jobs do not need it.

The output appears all at once (built under a hidden name, renamed at the end); on any error
nothing is left behind. --verify OUT_DIR checks every shard against the manifest later (after
a copy, say): exit 1 naming each shard that differs.

\b
Examples:
  fluidctl shard-data train.txt --trainers 4 -o shards/
  fluidctl shard-data data/ --trainers 8 -o shards/ --by files
  fluidctl shard-data 'logs/*.jsonl.gz' -n 4 -o shards/ --format jsonl --shuffle --seed 7
  fluidctl shard-data train.csv -n 4 -o shards/ --format csv --equalize pad
  fluidctl shard-data --verify shards/

\b
In the training script (reads PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM):
  from fluidctl.runtime.data import ShardReader
  for batch in ShardReader("shards/", batch_size=32): ...
"""



@click.command("shard-data", help=HELP, short_help="Split a data set into one shard per trainer.")
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@click.option("-n", "--trainers", type=int,
              help="Number of shards, one per trainer (required). Example: --trainers 4")
@click.option("-o", "--output", "out_dir", metavar="OUT_DIR",
              help="Directory to create for the shards (required). Example: -o shards/")
@click.option("--verify", "verify_dir", metavar="DIR", default=None,
              help="Instead of sharding: check every shard in DIR (an OUT_DIR of an earlier "
                   "run) against its manifest's sizes and digests; exit 1 naming each shard "
                   "that differs. Example: --verify shards/")
@click.option("--by", type=click.Choice(sharding.BY_CHOICES), default="lines", show_default=True,
              help="lines: contiguous ranges of records, order kept; files: whole input files "
                   "per shard, balanced by size. Example: --by files")
@click.option("--format", "fmt", type=click.Choice(sharding.FORMATS), default="text",
              show_default=True,
              help="text: one record per line; csv: the header line is repeated in every shard; "
                   "jsonl: every record must parse. Example: --format csv")
@click.option("--shuffle", is_flag=True,
              help="Shuffle records before sharding (shards then get equal record counts, +-1). "
                   "Example: --shuffle --seed 7")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for --shuffle and --equalize pad. Example: --seed 7")
@click.option("--name", default=None,
              help="Shard file name before the numeric suffix [default: the first input's file "
                   "name, .gz removed]. Example: --name train.txt")
@click.option("--suffix-length", type=int, default=5, show_default=True,
              help="Digits of the numeric suffix. Example: --suffix-length 3 gives train.txt-000")
@click.option("--equalize", type=click.Choice(sharding.EQUALIZE_CHOICES), default="none",
              show_default=True,
              help="Give every shard the same record count, as NCCL2 jobs need: pad re-samples "
                   "records (seeded) up to the largest shard, truncate cuts to the smallest. "
                   "Example: --equalize pad")
@click.option("--checksum", type=click.Choice(sharding.CHECKSUM_CHOICES), default=digest.DEFAULT,
              show_default=True,
              help="Digest of each shard in the manifest, computed during the copy: xxh3-128 "
                   "finds corrupted copies at 0.02 CPU-s/GiB; blake3 and sha256 are "
                   "cryptographic (0.18 and 0.6 CPU-s/GiB; sha256 is what sha256sum checks). "
                   "Example: --checksum sha256")
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it exists. Example: --force")
@click.option("--to-hosts", "to_hosts", metavar="HOSTFILE", default=None,
              help="Then send shard i only to the node of trainer i (slots= of the hostfile "
                   "must add up to --trainers), plus the manifest to every node, where each "
                   "shard is verified against its digest. Example: --to-hosts hosts")
@click.option("--remote-dir", default=None,
              help="With --to-hosts: a relative OUT_DIR goes under this directory on the nodes "
                   "[default: this directory's path]; '{host}' is the node's name. "
                   "Example: --remote-dir /data/job")
@click.option("--ssh-config", default=None,
              help="With --to-hosts: ssh config to read instead of ~/.ssh/config. "
                   "Example: --ssh-config ./ssh.cfg")
@click.option("--accept-new-host-keys", is_flag=True,
              help="With --to-hosts: trust host keys seen for the first time.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress bar and no summary table. Example: -q")
def shard_data(inputs, trainers, out_dir, verify_dir, by, fmt, shuffle, seed, name,
               suffix_length, equalize, checksum, force, to_hosts, remote_dir, ssh_config,
               accept_new_host_keys, quiet):
    if verify_dir is not None:
        if inputs or trainers is not None or out_dir is not None or to_hosts:
            raise UsageError("--verify DIR checks existing shards and takes no INPUT, "
                             "--trainers, -o or --to-hosts",
                             "run fluidctl shard-data --verify DIR alone")
        _verify(verify_dir, quiet)
        return
    for value, what in ((inputs, "INPUT"), (trainers, "option --trainers"),
                        (out_dir, "option -o/--output")):
        if value is None or value == ():
            raise UsageError(f"missing {what}",
                             "fluidctl shard-data train.txt --trainers 4 -o shards/; see --help")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)    # clean up the staging dir, as on Ctrl-C
    targets = None
    if to_hosts:            # every node is reachable before anything is written
        from fluidctl.sharding import distribute
        from fluidctl.planning.hosts import parse_hostfile
        hosts = parse_hostfile(to_hosts)
        placed = distribute.ranks_by_node(hosts, trainers)
        targets = distribute.connect(hosts, ssh_config=ssh_config,
                                     accept_new=accept_new_host_keys, timeout=10.0)
    elif remote_dir or ssh_config or accept_new_host_keys:
        raise UsageError("--remote-dir/--ssh-config/--accept-new-host-keys go with --to-hosts",
                         "add --to-hosts HOSTFILE or drop them")
    try:
        manifest = _shard(inputs, trainers, out_dir, by, fmt, shuffle, seed, name, suffix_length,
                          equalize, checksum, force, quiet)
        if targets is not None:
            resolved, connected = targets
            sent = distribute.send_shards(manifest, out_dir, resolved, connected.nodes, placed,
                                          remote_dir)
            if not quiet:
                for host, paths in sent.items():
                    click.echo(f"{host}: {', '.join(paths)}")
    finally:
        if targets is not None:
            targets[1].close()


def _shard(inputs, trainers, out_dir, by, fmt, shuffle, seed, name, suffix_length, equalize,
           checksum, force, quiet) -> dict:
    opts = sharding.ShardOptions(
        inputs=list(inputs), trainers=trainers, out_dir=out_dir, by=by, format=fmt,
        shuffle=shuffle, seed=seed, name=name, suffix_length=suffix_length, equalize=equalize,
        checksum=checksum, force=force)
    if quiet or not sys.stderr.isatty():       # rich is imported only when it will draw
        manifest = sharding.shard(opts)
    else:
        from fluidctl.console import console
        with RichProgress(console(stderr=True)) as progress:
            manifest = sharding.shard(opts, progress)
    if not quiet:
        print_summary(manifest, out_dir)
    return manifest


def _verify(directory: str, quiet: bool) -> None:
    """--verify DIR: one line per bad shard is still one line in all (the names joined)."""
    import os
    from fluidctl.runtime.data import read_manifest, shard_digest, verify_dir
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a directory",
                         "pass the -o directory of fluidctl shard-data")
    problems = verify_dir(directory)
    if problems:
        raise FluidctlError(f"{len(problems)} shard(s) differ from {directory}/manifest.json: "
                            + "; ".join(problems),
                            "copy them again or re-run fluidctl shard-data", exit_code=1)
    if not quiet:
        shards = read_manifest(directory)["shards"]
        algorithms = sorted({shard_digest(s)[0] or "size only" for s in shards})
        click.echo(f"ok: {len(shards)} shard(s) in {directory} match the manifest "
                   f"({', '.join(algorithms)})")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class RichProgress(sharding.Progress):
    """A rich bar (bytes, speed, records) for the engine's stages; thread-safe."""

    def __init__(self, console):
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)
        self._bar = Progress(TextColumn("{task.description:<16}"), BarColumn(),
                             DownloadColumn(binary_units=True), TransferSpeedColumn(),
                             TextColumn("{task.fields[records]:>12,} records"),
                             TimeRemainingColumn(), console=console, transient=True)
        self._task = None
        self._records = 0
        self._lock = threading.Lock()

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def stage(self, description: str, total_bytes: int) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._records = 0
            self._task = self._bar.add_task(description, total=total_bytes or None, records=0)

    def advance(self, nbytes: int, records: int = 0) -> None:
        with self._lock:
            if self._task is None:
                return
            self._records += records
            self._bar.update(self._task, advance=nbytes, records=self._records)


def print_summary(manifest: dict, out_dir: str) -> None:
    from fluidctl.tables import print_table
    rows = [(s["file"], f"{s['records']:,}", f"{s['bytes']:,}",
             f"{s['checksum']} {s['digest'][:16]}" if s["digest"] else "-")
            for s in manifest["shards"]]
    print_table(f"{len(manifest['shards'])} shards in {out_dir} "
                f"({manifest['records']:,} records, {manifest['bytes']:,} bytes)",
                ("shard", "records", "bytes", "digest"), rows,
                justify=("left", "right", "right", "left"))
