"""A float64 data-parallel job over canonical shards whose updates do not depend on the world
size, for the world-size change test (tests/cluster/test_slurm_resize.py): every step consumes
one global batch of GLOBAL_BATCH samples (GLOBAL_BATCH // world per rank, from ShardReader),
and the update is the mean gradient over that batch (an allreduce of the gradient sums and the
sample count). On a checkpoint request every rank commits the replicated weights with the
reader's state (``meta``) and stops; run again at another world size, it resumes from the
newest complete checkpoint. Every rank logs each consumed sample (OUT/TAG.samples.R, "epoch
id" lines) and optimizer step (OUT/TAG.steps.R); rank 0 of the run that finishes leaves the
weights in OUT/final.npy. ``reference(shards, epochs)`` is the same training in one process.
"""
import argparse
import os
import sys
import time

import numpy as np

GLOBAL_BATCH, DIM, LR, SEED = 12, 64, 0.5, 7


def gradient_sum(w, ids):
    """The sum over the samples ``ids`` of the gradient of 0.5 * (x . w - y)^2, with x and y
    derived from the sample's number."""
    x = np.cos(np.outer(ids, np.arange(1, DIM + 1)) * 0.01)
    y = np.sin(ids * 0.1)
    return x.T @ (x @ w - y)


def sample_ids(batch):
    return np.array([int(s.rsplit("-", 1)[1]) for s in batch], dtype=np.int64)


def reference(shards, epochs):
    """(weights, [the samples of each epoch]) of one uninterrupted single-process run."""
    from fluidctl.runtime.data import ShardReader
    reader = ShardReader(shards, GLOBAL_BATCH, seed=SEED, rank=0, world=1)
    w, consumed = np.zeros(DIM), []
    while reader.epoch < epochs:
        consumed.append([])
        for batch in reader:
            ids = sample_ids(batch)
            consumed[-1] += ids.tolist()
            w = w - LR * gradient_sum(w, ids) / len(ids)
    return w, consumed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shards")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-time", type=float, default=0.05)
    args = p.parse_args()

    import fluidctl.runtime as rt
    from fluidctl.runtime.checkpoint import Checkpointer
    from fluidctl.runtime.data import ShardReader
    ctx = rt.init()
    if GLOBAL_BATCH % ctx.world_size:
        raise SystemExit(f"world size {ctx.world_size} does not divide {GLOBAL_BATCH}")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{args.tag}.")
    samples = open(f"{base}samples.{ctx.rank}", "w")
    steps = open(f"{base}steps.{ctx.rank}", "w")
    events = open(f"{base}events.{ctx.rank}", "w")

    ck = Checkpointer(ctx, args.ckpt)
    found = ck.load()
    if found is not None:
        w, state, step = found.arrays["w"].copy(), found.meta["reader"], found.step + 1
        events.write(f"resumed {found.step} world {ctx.world_size}\n")
    else:
        w, state, step = np.zeros(DIM), None, 0
        events.write(f"fresh world {ctx.world_size}\n")
    events.flush()
    reader = ShardReader(args.shards, GLOBAL_BATCH // ctx.world_size, seed=SEED, state=state)
    while reader.epoch < args.epochs:
        epoch = reader.epoch
        for batch in reader:
            ids = sample_ids(batch)
            samples.writelines(f"{epoch} {i}\n" for i in ids)
            samples.flush()
            total = np.append(gradient_sum(w, ids), float(len(ids)))
            ctx.allreduce(total, op="sum")          # sums and count over the global batch
            w = w - LR * total[:-1] / total[-1]
            steps.write(f"{step}\n")
            steps.flush()
            if ctx.checkpoint_requested():
                ck.save(step, {"w": w}, meta={"reader": reader.state()}, replicated=True)
                events.write(f"saved {step}\n")
                events.flush()
                if ctx.checkpoint_stop:
                    events.write(f"stop {step}\n")
                    events.close()
                    rt.finalize()
                    return 0
            step += 1
            time.sleep(args.step_time)      # the step's compute
    if ctx.rank == 0:
        np.save(os.path.join(args.out, "final.npy"), w)
    events.write("finished\n")
    events.close()
    rt.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
