"""An unmodified torch DDP-style script with its own checkpointing, as users write it for
torchrun's elastic mode (gloo, CPU); the same arithmetic, checkpoints and progress.log as
elastic_train.py, so both launchers' runs are checked against one reference:

    torchrun --nnodes 2:3 --rdzv-backend c10d ... torch_elastic.py STEPS CKPT_DIR [STEP_SECONDS]
    fluidctl train --nodes 2:3 ... torch_elastic.py STEPS CKPT_DIR [STEP_SECONDS]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

SIZE, MOD = 8, 1000003


def main():
    steps, ckpt = int(sys.argv[1]), sys.argv[2]
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = os.path.join(ckpt, f"rank{rank}.json")
    held = json.load(open(mine)) if os.path.exists(mine) else {"step": 0, "w": None}
    latest = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(latest, torch.tensor([float(held["step"])], dtype=torch.float64))
    steps_held = [int(t.item()) for t in latest]
    start = max(steps_held)
    if start == 0:
        w = torch.arange(SIZE, dtype=torch.float64)
    else:
        w = torch.tensor(held["w"] if held["step"] == start else [0.0] * SIZE,
                         dtype=torch.float64)
        dist.broadcast(w, src=steps_held.index(start))
    log = open(os.path.join(ckpt, "progress.log"), "a") if rank == 0 else None
    if log:
        log.write(f"start {start} world {world} restart "
                  f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')} torch "
                  f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')} master "
                  f"{os.environ.get('MASTER_ADDR')} t {time.time():.3f}\n")
        log.flush()
    for s in range(start + 1, steps + 1):
        time.sleep(pause)                           # the step's compute
        g = torch.remainder(w * (rank + 1) + s, 97)
        dist.all_reduce(g)
        w = torch.remainder(w + g, MOD)
        tmp = f"{mine}.tmp"
        with open(tmp, "w") as f:
            json.dump({"step": s, "w": w.tolist()}, f)
        os.replace(tmp, mine)
        if log:
            log.write(f"step {s} world {world} t {time.time():.3f}\n")
            log.flush()
    if rank == 0:
        with open(os.path.join(ckpt, "final.json"), "w") as f:
            json.dump({"w": w.tolist()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
