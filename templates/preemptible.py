"""A training loop that survives preemption, time limits and requeues (fluidctl.runtime).

    fluidctl train --nproc 4 templates/preemptible.py --ckpt ckpt
    kill -USR1 <fluidctl's pid>        # or SIGTERM; under Slurm: --checkpoint-warning 120
    fluidctl train --nproc 4 templates/preemptible.py --ckpt ckpt      # resumes

``ctx.checkpoint_requested()`` is True on every rank at the same step once a checkpoint was
asked for (SIGTERM or SIGUSR1 to fluidctl, Slurm's warning signal, ``scancel --signal=USR1``,
``fluidctl job checkpoint JOB``); it costs one comparison per call between agreements.
``Checkpointer.save`` commits every rank's part at once (hashed, fsynced, renamed into place);
``load`` takes the newest complete checkpoint and skips a partial or corrupted one. After a
stop request the ranks exit 0 and fluidctl exits 75: under Slurm the job is requeued and
resumes here; elsewhere, run it again (or let --max-restarts do it).
"""
import argparse

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime.checkpoint import Checkpointer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default="ckpt")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=200, help="also checkpoint every N steps")
    args = p.parse_args()
    ctx = rt.init()
    ckpt = Checkpointer(ctx, args.ckpt)
    found = ckpt.load()
    w = found.arrays["w"].copy() if found else np.zeros(1000)
    start = found.step + 1 if found else 0
    if ctx.rank == 0:
        print(f"starting at step {start}" + (f" (from {found.path})" if found else ""))
    rng = np.random.default_rng(ctx.rank)
    for step in range(start, args.steps):
        grad = w - rng.standard_normal(w.shape)      # this rank's gradient
        ctx.allreduce(grad, op="mean")
        w -= 0.01 * grad
        asked = ctx.checkpoint_requested()            # every rank, every step
        if asked or (step + 1) % args.every == 0:
            ckpt.save(step, {"w": w}, replicated=True)   # equal on every rank: rank 0 writes
            if asked and ctx.checkpoint_stop:
                if ctx.rank == 0:
                    print(f"checkpointed step {step} on request; stopping to be resumed")
                break
    rt.finalize()


if __name__ == "__main__":
    main()
