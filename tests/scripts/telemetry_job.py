"""A job that makes one of each event the launcher's telemetry reports: a checkpoint commit
(step 3), a straggler (rank SLOW's data loader sleeps; attempt 0 runs until the launcher has
said so: DONE_FILE, its stragglers.json, appears), then a failure (rank FAIL exits 3) on
attempt 0, which the launcher restarts; attempt 1 takes a few healthy steps and ends 0.

    telemetry_job.py CKPT_DIR DONE_FILE [--slow R] [--fail R] [--again] [--release FILE]
                     [--min-steps N]

--again: the slow loader and the failure in every attempt (the job fails in the end);
--release: attempt 0 also waits for FILE (the test has looked at the running job);
--min-steps: every attempt takes at least N steps.
"""
import argparse
import os
import sys
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import checkpoint
from fluidctl.runtime.data import timed

p = argparse.ArgumentParser()
p.add_argument("ckpt_dir")
p.add_argument("done_file")
p.add_argument("--slow", type=int, default=1)
p.add_argument("--fail", type=int, default=1)
p.add_argument("--again", action="store_true")
p.add_argument("--release", default=None)
p.add_argument("--min-steps", type=int, default=0)
args = p.parse_args()
ctx = rt.init()
first = os.environ.get("PADDLE_RESTART_COUNT", "0") == "0"
faulty = first or args.again


def loader():
    while True:
        if faulty and ctx.rank == args.slow:
            time.sleep(0.05)                    # the fault: a data loader that sleeps
        yield np.ones(64, np.float32)


def enough(step: int) -> bool:
    if not first:
        return step >= max(5, args.min_steps)
    return step >= args.min_steps and os.path.exists(args.done_file) and (
        args.release is None or os.path.exists(args.release))


ck = checkpoint.Checkpointer(ctx, args.ckpt_dir)
grad = np.zeros(65, np.float32)
deadline = time.monotonic() + 90
for step, batch in enumerate(timed(loader())):
    grad[:64] = batch
    grad[64] = 1.0 if enough(step) or time.monotonic() > deadline else 0.0
    ctx.allreduce(grad)
    if first and step == 3:
        ck.save(step, {"w": grad.copy()})
    if grad[64] > 0:
        break
rt.finalize()
sys.exit(3 if faulty and ctx.rank == args.fail else 0)
