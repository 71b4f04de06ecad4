"""A training loop that survives preemption, time limits and requeues (fluidctl.runtime).

    fluidctl train --nproc 4 templates/preemptible.py --ckpt ckpt
    kill -USR1 <fluidctl's pid>        # or SIGTERM; under Slurm: --checkpoint-warning 120
    fluidctl train --nproc 4 templates/preemptible.py --ckpt ckpt      # resumes

With data that resumes exactly at any world size (canonical shards, ShardReader's state saved
in the checkpoint), e.g. stopped at 4 ranks and resumed at 3:

    fluidctl shard-data train.txt --shards 16 -o canon    # a line: DIM numbers, then the target
    fluidctl train --nproc 4 templates/preemptible.py --ckpt ckpt --data canon --dim 8
    fluidctl train --nproc 3 templates/preemptible.py --ckpt ckpt --data canon --dim 8

``ctx.checkpoint_requested()`` is True on every rank at the same step once a checkpoint was
asked for (SIGTERM or SIGUSR1 to fluidctl, Slurm's warning signal, ``scancel --signal=USR1``,
``fluidctl job checkpoint JOB``); it costs one comparison per call between agreements.
``Checkpointer.save`` commits every rank's part at once (hashed, fsynced, renamed into place);
``load`` takes the newest complete checkpoint and skips a partial or corrupted one. After a
stop request the ranks exit 0 and fluidctl exits 75: under Slurm the job is requeued and
resumes here; elsewhere, run it again (or let --max-restarts do it).

With --data every step is one global batch of --global-batch samples (that many divided by
the world size per rank) and the update is the mean gradient over it (an allreduce of the
gradient sums and the sample count), so the weights do not depend on the world size: the
replicated weights load at any world size, and ``reader.state()`` (saved in ``meta``) makes
the resumed reader hand out exactly the samples of the epoch not yet consumed.
"""
import argparse

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime.checkpoint import Checkpointer
from fluidctl.runtime.data import ShardReader


def batches(reader):
    """The reader's batches, epoch after epoch."""
    while True:
        yield from reader


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default="ckpt")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=200, help="also checkpoint every N steps")
    p.add_argument("--data", help="canonical shards (shard-data --shards N); else random data")
    p.add_argument("--dim", type=int, default=1000)
    p.add_argument("--global-batch", type=int, default=48,
                   help="samples per step over all ranks (a multiple of the world size)")
    args = p.parse_args()
    ctx = rt.init()
    ckpt = Checkpointer(ctx, args.ckpt)
    found = ckpt.load()
    w = found.arrays["w"].copy() if found else np.zeros(args.dim)
    start = found.step + 1 if found else 0
    if ctx.rank == 0:
        print(f"starting at step {start}" + (f" (from {found.path})" if found else ""))
    reader = data = None
    if args.data:
        if args.global_batch % ctx.world_size:
            raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of the "
                             f"world size {ctx.world_size}")
        reader = ShardReader(args.data, args.global_batch // ctx.world_size, seed=0,
                             state=found.meta.get("reader") if found else None)
        data = batches(reader)
    rng = np.random.default_rng(ctx.rank)
    for step in range(start, args.steps):
        if reader is not None:
            rows = np.array([line.replace(",", " ").split() for line in next(data)],
                            dtype=np.float64).reshape(-1, args.dim + 1)
            x, y = rows[:, :-1], rows[:, -1]
            total = np.append(x.T @ (x @ w - y), len(rows))   # gradient sum, sample count
            ctx.allreduce(total, op="sum")
            w -= 0.01 * total[:-1] / total[-1]                 # mean over the global batch
        else:
            grad = w - rng.standard_normal(w.shape)      # this rank's gradient
            ctx.allreduce(grad, op="mean")
            w -= 0.01 * grad
        asked = ctx.checkpoint_requested()            # every rank, every step
        if asked or (step + 1) % args.every == 0:
            meta = {"reader": reader.state()} if reader is not None else {}
            # equal on every rank: rank 0 writes
            ckpt.save(step, {"w": w}, meta=meta, replicated=True)
            if asked and ctx.checkpoint_stop:
                if ctx.rank == 0:
                    print(f"checkpointed step {step} on request; stopping to be resumed")
                break
    rt.finalize()


if __name__ == "__main__":
    main()
