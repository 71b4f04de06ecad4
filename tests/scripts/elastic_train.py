"""A DDP-style job that checkpoints every step and resumes, for elastic tests and
bench/elastic.py:

    elastic_train.py STEPS CKPT_DIR [STEP_SECONDS] [HOLD_AFTER]

Every rank holds the same weights w (integers in float64, so sums are exact in any order);
step s: each rank's gradient is ((w * (rank + 1) + s) % 97), allreduced (sum), and
w = (w + G) % 1000003. After each step every rank writes its own checkpoint
CKPT_DIR/rank<R>.json (step, w). At start each rank reads its own checkpoint; the ranks agree
on the newest step any of them holds and take its weights from the rank that holds it (the
step was completed, so its weights are the job's). Rank 0 appends one line per step and per
start to CKPT_DIR/progress.log (step, world size, time), and writes CKPT_DIR/final.json.
``reference(worlds)`` recomputes the weights for a world size per step.

HOLD_AFTER (steps, comma-separated): after such a step every rank waits for CKPT_DIR/go.<step>
(at most HOLD_SECONDS), which the test writes once it has injected the fault meant for that
step: a loaded machine cannot run the job to its end before the fault is in.
"""
import json
import os
import sys
import time

import numpy as np

SIZE = 8
MOD = 1000003


def step(w, s, world):
    grads = sum(((w * (r + 1) + s) % 97) for r in range(world))
    return (w + grads) % MOD


def reference(worlds):
    """The weights after steps 1..len(worlds), step s run by worlds[s - 1] ranks."""
    w = np.arange(SIZE, dtype=np.float64)
    for s, world in enumerate(worlds, start=1):
        w = step(w, s, world)
    return w.tolist()


def write_json(path, record):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


HOLD_SECONDS = 120.0


def hold(go: str) -> None:
    """Wait for the test's word (a file) that the fault for this step is in."""
    deadline = time.monotonic() + HOLD_SECONDS
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)


def main():
    steps, ckpt = int(sys.argv[1]), sys.argv[2]
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    holds = {int(x) for x in sys.argv[4].split(",") if x} if len(sys.argv) > 4 else set()
    import fluidctl.runtime as rt
    ctx = rt.init()
    rank, world = ctx.rank, ctx.world_size
    mine = os.path.join(ckpt, f"rank{rank}.json")
    held = json.load(open(mine)) if os.path.exists(mine) else {"step": 0, "w": None}
    latest = ctx.allgather(np.array([held["step"]], dtype=np.float64)).ravel()
    start = int(latest.max())
    w = np.array(held["w"] if held["w"] and held["step"] == start else [0.0] * SIZE)
    if start == 0:
        w = np.arange(SIZE, dtype=np.float64)
    else:
        ctx.broadcast(w, root=int(latest.argmax()))
    log = open(os.path.join(ckpt, "progress.log"), "a") if rank == 0 else None
    if log:
        log.write(f"start {start} world {world} restart "
                  f"{os.environ.get('PADDLE_RESTART_COUNT')} torch "
                  f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')} master "
                  f"{os.environ.get('MASTER_ADDR')} t {time.time():.3f}\n")
        log.flush()
    for s in range(start + 1, steps + 1):
        time.sleep(pause)                           # the step's compute
        g = (w * (rank + 1) + s) % 97
        ctx.allreduce(g)
        w = (w + g) % MOD
        write_json(mine, {"step": s, "w": w.tolist()})
        if log:
            log.write(f"step {s} world {world} t {time.time():.3f}\n")
            log.flush()
        if s in holds:
            hold(os.path.join(ckpt, f"go.{s}"))
    if rank == 0:
        write_json(os.path.join(ckpt, "final.json"), {"w": w.tolist()})
        print(f"elastic_train done: {steps} steps, world {world}", flush=True)
    rt.finalize()


if __name__ == "__main__":
    main()
