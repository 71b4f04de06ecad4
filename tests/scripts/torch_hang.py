"""An unmodified torch DDP script (CPU, gloo) that goes wrong on rank 1: torch_hang.py SCENARIO.

uneven  rank 1 has one batch, rank 0 three: rank 1 leaves the loop and waits in the final
        barrier while rank 0 waits in backward for rank 1's gradients (DDP's classic hang)
stop    rank 1 stops itself (SIGSTOP) after the first step: a dead peer
quiet   no fault: every rank trains for SECONDS (default 5) without printing anything
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

scenario = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if scenario == "quiet":                 # healthy and silent: no false alarm
    end, go = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 5), torch.ones(1)
    while go.item():
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        go[0] = float(time.monotonic() < end)
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
batches = [torch.randn(8, 4) for _ in range(1 if scenario == "uneven" and rank == 1 else 3)]
batches = [] if scenario == "quiet" else batches
for step, x in enumerate(batches):
    if scenario == "stop" and rank == 1 and step == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    print(f"rank {rank} step {step}", flush=True)
dist.barrier()
dist.destroy_process_group()
