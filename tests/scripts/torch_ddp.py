"""An unmodified torch DDP script (CPU, gloo), as users write it for torchrun.

    fluidctl train --nproc 2 tests/scripts/torch_ddp.py
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])

torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)
for _ in range(3):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
weights = model.module.weight.detach().flatten().tolist()
print(f"torch rank {rank}/{world} local {local_rank} allreduce {t.item():.1f} weights {weights}",
      flush=True)
dist.destroy_process_group()
