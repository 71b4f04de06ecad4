"""``fluidctl shard-data``, the click command: its options and help. The work (options ->
ShardOptions -> fluidctl.sharding.shard()) is ``fluidctl.sharding.run.run``, which
``fluidctl.cli`` also calls directly for the plain forms (``fluidctl.fastargs``)."""
from __future__ import annotations

import click

from fluidctl import sharding
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
def shard_data(**params):
    from fluidctl.sharding.run import run
    run(**params)
