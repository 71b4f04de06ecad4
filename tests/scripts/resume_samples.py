"""A trainer that logs every sample it consumes and saves its reader's state: reads canonical
shards with ShardReader for --steps steps (0: to the epoch's end), resuming from --state.
Writes LOGDIR/TAG-rank<r>.samples ("epoch sample" lines) and LOGDIR/TAG-rank<r>.state.json.
Used by tests/e2e/test_canonical_resume.py under fluidctl train --nproc N."""
import argparse
import json
import os

from fluidctl import envs, paths
from fluidctl.runtime.data import ShardReader

parser = argparse.ArgumentParser()
parser.add_argument("shards")
parser.add_argument("logdir")
parser.add_argument("tag")
parser.add_argument("--state")
parser.add_argument("--steps", type=int, default=0)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seed", type=int, default=7)
args = parser.parse_args()

rank = envs.read().rank
state = None
if args.state:
    with open(args.state) as f:
        state = json.load(f)
reader = ShardReader(args.shards, args.batch, seed=args.seed, state=state)
epoch, steps = reader.epoch, len(reader)
base = os.path.join(args.logdir, f"{args.tag}-rank{rank}")
with open(base + ".samples", "w") as log:
    for step, batch in enumerate(reader, 1):
        log.writelines(f"{epoch} {sample}\n" for sample in batch)
        if step == args.steps:
            break
paths.write_atomic(base + ".state.json", json.dumps(reader.state()))
print(f"rank {rank}: epoch {epoch}, {min(args.steps or steps, steps)} of {steps} step(s), "
      f"state {reader.state()}", flush=True)
