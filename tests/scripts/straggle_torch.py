"""tests/scripts/straggle.py for torch (CPU, gloo), as users write it for torchrun: each step
reads a batch, computes, and allreduces a gradient whose last element says whether to stop.

    torchrun --nproc-per-node 3 tests/scripts/straggle_torch.py [--steps N] [--work MS]
        [--floats N] [--slow-data RANK:MS:FROM_STEP] [--stop-file PATH]
"""
import os
import time

import torch
import torch.distributed as dist

import straggleargs

args, (slow_rank, slow_ms, slow_from) = straggleargs.parse()
torch.set_num_threads(1)            # one core per rank, as straggle.py
dist.init_process_group("gloo")
rank = dist.get_rank()


def loader():
    step = 0
    while True:
        if rank == slow_rank and step >= slow_from:
            time.sleep(slow_ms / 1e3)            # the fault: a data loader that sleeps
        yield torch.full((256,), float(step))
        step += 1


a = torch.randn(96, 96, generator=torch.Generator().manual_seed(rank))
began = time.thread_time()
for _ in range(20):
    a = torch.tanh(a @ a)
rounds = torch.tensor([max(1, int(args.work / 1e3 / ((time.thread_time() - began) / 20)))])
dist.all_reduce(rounds, op=dist.ReduceOp.MIN)

grad = torch.zeros(args.floats)
for step, batch in zip(range(args.steps), loader()):
    for _ in range(int(rounds)):
        a = torch.tanh(a @ a)
    grad.fill_(float(batch[0]))
    grad[-1] = 1.0 if os.path.exists(args.stop_file) else 0.0
    dist.all_reduce(grad)
    if rank == 0:
        print(f"step {step}", flush=True)
    if grad[-1] > 0:
        break
dist.destroy_process_group()
