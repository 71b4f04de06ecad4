"""A job that saves a checkpoint every step and resumes from it: STEPS steps, each an allreduce
over every rank of (rank + 1) * step, summed into ``value``; each rank keeps its last two
(step, value) pairs in ckpt.RANK.json in the working directory (written atomically). Started
again, the ranks agree on the newest step every one of them saved and go on from there, so the
final value is the same whether or not the job was restarted. Prints 'rank R started at step S'
and, at the end, 'rank R done: step N value V'. Used by tests/cluster/test_k8s_netns.py."""
import json
import os
import sys
import time

import numpy as np

import fluidctl.runtime as rt

steps, pause = int(sys.argv[1]), float(sys.argv[2])
ctx = rt.init()
path = f"ckpt.{ctx.rank}.json"
saved = {"0": 0.0}
if os.path.exists(path):
    with open(path) as f:
        saved = json.load(f)
newest = np.array([max(int(s) for s in saved)], dtype=np.int64)
ctx.allreduce(newest, op="min")         # a rank may be one step ahead of another
step = int(newest[0])
value = saved[str(step)]
print(f"rank {ctx.rank} started at step {step}", flush=True)
while step < steps:
    step += 1
    x = np.array([(ctx.rank + 1) * step], dtype=np.float64)
    ctx.allreduce(x)
    value += float(x[0])
    saved = {str(step - 1): saved.get(str(step - 1), value - float(x[0])), str(step): value}
    with open(path + ".tmp", "w") as f:
        json.dump(saved, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    time.sleep(pause)
print(f"rank {ctx.rank} done: step {step} value {value}", flush=True)
rt.finalize()
