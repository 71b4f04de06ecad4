"""What ``fluidctl shard-data`` does, without click: ``fluidctl.cli.main`` parses its plain forms
with ``fluidctl.fastargs`` and calls ``run`` directly (click and what it imports are a third of
a small file's whole run); ``commands/shard_data.py`` is the click command (--help, the odd
forms, click's own messages) and calls the same ``run``."""
from __future__ import annotations

import sys

from fluidctl import digest, sharding, sigs
from fluidctl.errors import FluidctlError, UsageError


def run(inputs=(), trainers=None, out_dir=None, verify_dir=None, shards=None, by="lines",
        fmt="text",
        shuffle=False, seed=0, name=None, suffix_length=5, equalize="none",
        checksum=digest.DEFAULT, force=False, to_hosts=None, remote_dir=None, ssh_config=None,
        accept_new_host_keys=False, quiet=False) -> None:
    """Shard INPUT... (see ``fluidctl shard-data --help``), or check shards with verify_dir."""
    if verify_dir is not None:
        if inputs or trainers is not None or shards is not None or out_dir is not None \
                or to_hosts:
            raise UsageError("--verify DIR checks existing shards and takes no INPUT, "
                             "--trainers, --shards, -o or --to-hosts",
                             "run fluidctl shard-data --verify DIR alone")
        _verify(verify_dir, quiet)
        return
    canonical = shards is not None
    if canonical and trainers is not None:
        raise UsageError("--trainers N writes one shard per trainer, --shards N canonical "
                         "shards any number of trainers read: not both",
                         "pass --shards N alone to resume at any world size")
    if canonical and to_hosts:
        raise UsageError("--to-hosts sends shard i to trainer i's node, and canonical shards "
                         "are read by every trainer", "copy OUT_DIR to every node with "
                         "fluidctl cluster sync, or use --trainers N --to-hosts")
    trainers = shards if canonical else trainers
    for value, what in ((inputs, "INPUT"), (trainers, "option --trainers or --shards"),
                        (out_dir, "option -o/--output")):
        if value is None or value == ():
            raise UsageError(f"missing {what}",
                             "fluidctl shard-data train.txt --trainers 4 -o shards/; see --help")
    sigs.signal(sigs.SIGTERM, _exit_on_sigterm)    # clean up the staging dir, as on Ctrl-C
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
                          equalize, checksum, force, quiet, canonical)
        if targets is not None:
            resolved, connected = targets
            sent = distribute.send_shards(manifest, out_dir, resolved, connected.nodes, placed,
                                          remote_dir)
            if not quiet:
                for host, paths in sent.items():
                    print(f"{host}: {', '.join(paths)}", flush=True)
    finally:
        if targets is not None:
            targets[1].close()


def _shard(inputs, trainers, out_dir, by, fmt, shuffle, seed, name, suffix_length, equalize,
           checksum, force, quiet, canonical=False) -> dict:
    opts = sharding.ShardOptions(
        inputs=list(inputs), trainers=trainers, out_dir=out_dir, by=by, format=fmt,
        shuffle=shuffle, seed=seed, name=name, suffix_length=suffix_length, equalize=equalize,
        checksum=checksum, force=force, canonical=canonical)
    if quiet or not sys.stderr.isatty():       # rich is imported only when it will draw
        manifest = sharding.shard(opts)
    else:
        from fluidctl.console import console
        with RichProgress(console(stderr=True)) as progress:
            manifest = sharding.shard(opts, progress)
    if not quiet:
        print_summary(manifest, out_dir)
    if equalize == "none" and not canonical:
        warn_unequal(manifest)
    return manifest


def warn_unequal(manifest: dict) -> None:
    """One warning line when the shards' record counts differ: trainers of a collective job
    that run out of records first leave the others waiting at the last step."""
    counts = [s["records"] for s in manifest["shards"]]
    if counts and min(counts) != max(counts):
        print(f"warning: the shards hold {min(counts):,} to {max(counts):,} records: a "
              "collective job stalls at its last step, the trainers with more waiting for the "
              "ones that ran out (add --equalize pad or --equalize truncate)", file=sys.stderr, flush=True)


def _verify(directory: str, quiet: bool) -> None:
    """--verify DIR: one line per bad shard is still one line in all (the names joined)."""
    import os
    from fluidctl.runtime.data import read_manifest, shard_digest, verify_dir
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a directory",
                         "pass the -o directory of fluidctl shard-data")
    problems = verify_dir(directory)
    if problems:
        raise FluidctlError(f"{len(problems)} shard(s) differ from "
                            f"{os.path.join(directory, 'manifest.json')}: "
                            + "; ".join(problems),
                            "copy them again or re-run fluidctl shard-data", exit_code=1)
    if not quiet:
        shards = read_manifest(directory)["shards"]
        algorithms = sorted({shard_digest(s)[0] or "size only" for s in shards})
        print(f"ok: {len(shards)} shard(s) in {directory} match the manifest "
              f"({', '.join(algorithms)})", flush=True)


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
        import threading                    # rich imported it already: free here
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
