"""A data-parallel loop for the straggler tests: each step reads a batch, computes, and
allreduces a gradient whose last element says whether to stop (any rank that sees STOP_FILE).

    straggle.py [--steps N] [--work MS] [--floats N] [--slow-data RANK:MS:FROM_STEP]
                [--stop-file PATH]

Prints "step N" on rank 0 after every step, flushed.
"""
import os
import sys
import time

os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"   # as torch's
import numpy as np  # noqa: E402

import fluidctl.runtime  # noqa: E402
from fluidctl.runtime.data import timed  # noqa: E402
import straggleargs  # noqa: E402

args, (slow_rank, slow_ms, slow_from) = straggleargs.parse()
ctx = fluidctl.runtime.init()


def loader():
    step = 0
    while True:
        if ctx.rank == slow_rank and step >= slow_from:
            time.sleep(slow_ms / 1e3)            # the fault: a data loader that sleeps
        yield np.full(256, step, np.float32)
        step += 1


a = np.random.default_rng(ctx.rank).standard_normal((96, 96))
# ``rounds`` matmuls take --work ms of CPU time (CPU time: the machine's load does not change it)
began = time.thread_time()
for _ in range(20):
    a = np.tanh(a @ a)
rounds = max(1, int(args.work / 1e3 / ((time.thread_time() - began) / 20)))
rounds = int(ctx.allreduce(np.array([rounds], np.int64), op="min")[0])

grad = np.zeros(args.floats, np.float32)
for step, batch in zip(range(args.steps), timed(loader())):
    for _ in range(rounds):
        a = np.tanh(a @ a)
    grad[:] = batch[0]
    grad[-1] = 1.0 if os.path.exists(args.stop_file) else 0.0
    ctx.allreduce(grad)
    if ctx.rank == 0:
        print(f"step {step}", flush=True)
    if grad[-1] > 0:
        break
fluidctl.runtime.finalize()
sys.exit(0)
