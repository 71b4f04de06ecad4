"""A 2-rank job that makes one of each event the launcher's telemetry reports: a checkpoint
commit (step 3), a straggler (rank 1's data loader sleeps until the launcher has said so:
DONE_FILE, its stragglers.json, appears), then a failure (rank 1 exits 3) on attempt 0,
which the launcher restarts; attempt 1 takes a few healthy steps and ends 0.

    telemetry_job.py CKPT_DIR DONE_FILE
"""
import os
import sys
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import checkpoint
from fluidctl.runtime.data import timed

ckpt_dir, done_file = sys.argv[1], sys.argv[2]
ctx = rt.init()
first = os.environ.get("PADDLE_RESTART_COUNT", "0") == "0"


def loader():
    while True:
        if first and ctx.rank == 1:
            time.sleep(0.05)                    # the fault: a data loader that sleeps
        yield np.ones(64, np.float32)


ck = checkpoint.Checkpointer(ctx, ckpt_dir)
grad = np.zeros(65, np.float32)
deadline = time.monotonic() + 90
for step, batch in enumerate(timed(loader())):
    grad[:64] = batch
    grad[64] = 1.0 if (not first and step >= 5) or os.path.exists(done_file) \
        or time.monotonic() > deadline else 0.0
    ctx.allreduce(grad)
    if first and step == 3:
        ck.save(step, {"w": grad.copy()})
    if grad[64] > 0:
        break
rt.finalize()
sys.exit(3 if first and ctx.rank == 1 else 0)
