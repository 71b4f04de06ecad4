"""``fluidctl shard-data``, the click command: its help; its options are declared once, in
``fluidctl.fastargs.SHARD_DATA``. The work (options -> ShardOptions -> fluidctl.sharding.shard())
is ``fluidctl.sharding.run.run``, which ``fluidctl.cli`` also calls directly for the plain forms."""
from __future__ import annotations

import click

from fluidctl import fastargs
from fluidctl.commands import fastoptions

HELP = """Split INPUT... into one shard per trainer: OUT_DIR/<name>-00000, -00001, ... plus
OUT_DIR/manifest.json (inputs, options, and per shard its file, records, bytes and digest,
xxh3-128 by default, with the name of the algorithm beside it).

--shards N writes N canonical shards instead, independent of the trainer count: every rank
reads its part of each epoch's global order over all of them, and a job stopped at one world
size resumes at another with exactly the samples it had not consumed (ShardReader's state).

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
  fluidctl shard-data train.txt --shards 64 -o canon/ --shuffle
  fluidctl shard-data --verify shards/

\b
In the training script (reads PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM):
  from fluidctl.runtime.data import ShardReader
  for batch in ShardReader("shards/", batch_size=32): ...
  reader = ShardReader("canon/", batch_size=32, seed=7, state=saved_or_None)
  ... save reader.state() with each checkpoint
"""



@click.command("shard-data", help=HELP, short_help="Split a data set into shards: per trainer, or canonical.")
@fastoptions.parameters(fastargs.SHARD_DATA)
def shard_data(**params):
    from fluidctl.sharding.run import run
    run(**params)
