"""A deterministic float64 data-parallel job for the preemption tests: every optimizer step is
logged per rank (OUT/steps.R), it checkpoints on request (fluidctl.runtime.checkpoint) and
every --every steps, resumes from the newest complete checkpoint, and rank 0 leaves the final
weights in OUT/final.npy. ``reference(world, steps, dim)`` is the same training in one process.

--pause-save R:S:STEP: once (OUT/paused.R marks it), rank R sleeps S seconds after writing its
part of a checkpoint at STEP or later (before the commit) and leaves OUT/saving.R holding its
pid, so a test can kill it or signal the job during the save.

--resumed-step-time: the step time of a resumed run (default --step-time), so that a test
whose first run must outlast a slow outside event (Slurm's time-limit check) does not wait as
long again for the steps left after the resume.
"""
import argparse
import os
import sys
import time

import numpy as np


def gradient(w, step, rank):
    return np.sin(w + 0.01 * step) * (1.0 + 0.1 * rank) + np.cos(0.001 * step * (rank + 1))


def reference(world, steps, dim):
    w = np.linspace(-1.0, 1.0, dim)
    for step in range(steps):
        g = sum(gradient(w, step, r) for r in range(world)) / world
        w = w - 0.05 * g
    return w


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dim", type=int, default=1000)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--resumed-step-time", type=float, default=None)
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--pause-save", default="")
    args = p.parse_args()

    import fluidctl.runtime as rt
    from fluidctl.runtime import checkpoint
    ctx = rt.init()
    out = args.out
    os.makedirs(out, exist_ok=True)
    if args.pause_save:
        who, seconds, from_step = args.pause_save.split(":")
        once = os.path.join(out, f"paused.{ctx.rank}")
        if int(who) == ctx.rank and not os.path.exists(once):
            write = checkpoint.write_part

            def slow_write(path, arrays, algorithm):
                record = write(path, arrays, algorithm)
                if int(path.parent.name.rsplit("-", 1)[1]) >= int(from_step):
                    open(once, "w").close()
                    with open(os.path.join(out, f"saving.{ctx.rank}"), "w") as f:
                        f.write(str(os.getpid()))
                    time.sleep(float(seconds))
                return record
            checkpoint.write_part = slow_write
    events = open(os.path.join(out, f"events.{ctx.rank}"), "a")

    def event(text):
        events.write(text + "\n")
        events.flush()

    ck = checkpoint.Checkpointer(ctx, args.ckpt)
    found = ck.load()
    if found is not None:
        w, done = found.arrays["w"].copy(), int(found.arrays["done"][0])
        start = found.step + 1
        event(f"resumed {found.step}")
        if args.resumed_step_time is not None:
            args.step_time = args.resumed_step_time
    else:
        w, done, start = np.linspace(-1.0, 1.0, args.dim), 0, 0
        event("fresh")
    steps = open(os.path.join(out, f"steps.{ctx.rank}"), "a")
    for step in range(start, args.steps):
        g = gradient(w, step, ctx.rank)
        ctx.allreduce(g, op="sum")
        w = w - 0.05 * (g / ctx.world_size)
        done += 1
        steps.write(f"{step}\n")
        steps.flush()
        if step == start:
            print(f"first step {step} at {time.time():.6f}", flush=True)
        asked = ctx.checkpoint_requested()
        if asked or (args.every and (step + 1) % args.every == 0):
            ck.save(step, {"w": w, "done": np.array([done], dtype=np.int64)})
            event(f"saved {step}")
            if asked and ctx.checkpoint_stop:
                event(f"stop {step}")
                rt.finalize()
                return 0
        time.sleep(args.step_time)      # the step's compute
    if ctx.rank == 0:
        np.save(os.path.join(out, "final.npy"), w)
    event("finished")
    rt.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
