"""A 4-rank job for ``fluidctl report``: rank 2's data loader sleeps (a straggler), rank 0
commits a checkpoint at step 3, and rank 3 exits 3 at the end of each attempt, so with
--max-restarts 1 the job has two attempts, a restart and a failure (failure.json).
Attempt 0 runs until the launcher named the straggler (DONE_FILE, its stragglers.json,
appears), the test let it go (RELEASE_FILE appears: it has made a report of the running job)
and at least MIN_STEPS; attempt 1 runs MIN_STEPS.

    report_job.py CKPT_DIR DONE_FILE RELEASE_FILE [MIN_STEPS]
"""
import os
import sys
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import checkpoint
from fluidctl.runtime.data import timed

ckpt_dir, done_file, release_file = sys.argv[1:4]
min_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 60
ctx = rt.init()
first = os.environ.get("PADDLE_RESTART_COUNT", "0") == "0"


def loader():
    while True:
        if ctx.rank == 2:
            time.sleep(0.03)                    # the fault: a data loader that sleeps
        yield np.ones(64, np.float32)


ck = checkpoint.Checkpointer(ctx, ckpt_dir)
grad = np.zeros(65, np.float32)
deadline = time.monotonic() + 90
for step, batch in enumerate(timed(loader())):
    grad[:64] = batch
    enough = step >= min_steps and (not first or (os.path.exists(done_file)
                                                  and os.path.exists(release_file)))
    grad[64] = 1.0 if enough or time.monotonic() > deadline else 0.0
    ctx.allreduce(grad)
    if first and step == 3:
        ck.save(step, {"w": grad.copy()})
    if grad[64] > 0:
        break
rt.finalize()
sys.exit(3 if ctx.rank == 3 else 0)
