"""tests/scripts/straggle.py for torch (CPU, gloo), as users write it for torchrun: a DDP model
fed by a DataLoader; each step computes, runs backward (DDP allreduces the gradient) and
allreduces a flag that says whether to stop. Nothing of fluidctl in it.

    torchrun --nproc-per-node 3 tests/scripts/straggle_torch.py [--steps N] [--work MS]
        [--floats N] [--slow-data RANK:MS:FROM_STEP] [--slow-compute RANK:MS:FROM_STEP]
        [--stop-file PATH]
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import straggleargs

args, (slow_rank, slow_ms, slow_from) = straggleargs.parse()
hog_rank, hog_ms, hog_from = args.slow_compute
torch.set_num_threads(1)            # one core per rank, as straggle.py
dist.init_process_group("gloo")
rank = dist.get_rank()


class Batches(torch.utils.data.IterableDataset):
    def __iter__(self):
        step = 0
        while True:
            if rank == slow_rank and step >= slow_from:
                time.sleep(slow_ms / 1e3)            # the fault: a data loader that sleeps
            yield torch.full((args.floats,), float(step))
            step += 1


a = torch.randn(96, 96, generator=torch.Generator().manual_seed(rank))


def work(ms):
    began = time.thread_time()
    while time.thread_time() - began < ms / 1e3:
        torch.tanh(a @ a)


model = DistributedDataParallel(torch.nn.Linear(args.floats, 1, bias=False))
flag = torch.zeros(1)
loader = torch.utils.data.DataLoader(Batches(), batch_size=None)
for step, batch in zip(range(args.steps), loader):
    work(args.work + (hog_ms if rank == hog_rank and step >= hog_from else 0))
    model(batch).sum().backward()
    flag[0] = 1.0 if os.path.exists(args.stop_file) else 0.0
    dist.all_reduce(flag)
    if rank == 0:
        print(f"step {step}", flush=True)
    if flag[0] > 0:
        break
dist.destroy_process_group()
