"""tests/scripts/straggle.py for PaddlePaddle (CPU, gloo), as users write it: a DataParallel
model fed by a paddle.io.DataLoader; each step computes, runs backward (DataParallel allreduces
the gradient) and allreduces a flag that says whether to stop. Nothing of fluidctl in it.

    fluidctl train --nproc 3 tests/scripts/straggle_paddle.py [--steps N] [--work MS]
        [--slow-data RANK:MS:FROM_STEP] [--slow-compute RANK:MS:FROM_STEP] [--stop-file PATH]
"""
import os
import time

import numpy as np
import paddle
import paddle.distributed as dist

import straggleargs

args, (slow_rank, slow_ms, slow_from) = straggleargs.parse()
hog_rank, hog_ms, hog_from = args.slow_compute
paddle.set_device("cpu")
dist.init_parallel_env()
rank = dist.get_rank()


class Batches(paddle.io.IterableDataset):
    def __iter__(self):
        step = 0
        while True:
            if rank == slow_rank and step >= slow_from:
                time.sleep(slow_ms / 1e3)            # the fault: a data loader that sleeps
            yield np.full((args.floats,), float(step), "float32")
            step += 1


a = np.random.default_rng(rank).normal(size=(96, 96)).astype("float32")


def work(ms):
    began = time.thread_time()
    while time.thread_time() - began < ms / 1e3:
        np.tanh(a @ a)


model = paddle.DataParallel(paddle.nn.Linear(args.floats, 1, bias_attr=False))
loader = paddle.io.DataLoader(Batches(), batch_size=None, num_workers=0)
for step, batch in zip(range(args.steps), loader):
    work(args.work + (hog_ms if rank == hog_rank and step >= hog_from else 0))
    model(batch).sum().backward()
    flag = paddle.to_tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
    dist.all_reduce(flag)
    if rank == 0:
        print(f"step {step}", flush=True)
    if float(flag[0]) > 0:
        break
