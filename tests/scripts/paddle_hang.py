"""An unmodified PaddlePaddle data-parallel script (CPU, gloo) that goes wrong on rank 1:
paddle_hang.py SCENARIO.

stop    rank 1 stops itself (SIGSTOP) after the first step: a dead peer
skip    rank 1 leaves out the loss all_reduce of its second step: it waits for a file that
        never comes, outside any collective, while rank 0 waits in the all_reduce: a desync.
        (Had rank 1 gone on to its final barrier instead, gloo would have aborted rank 0 at
        once: "op.preamble.length <= op.nbytes. 8 vs 4", a barrier's message in an
        all_reduce.)
"""
import os
import signal
import sys
import time

import numpy as np
import paddle
import paddle.distributed as dist

scenario = sys.argv[1]
paddle.set_device("cpu")
dist.init_parallel_env()
rank = dist.get_rank()
paddle.seed(2024)
model = paddle.DataParallel(paddle.nn.Linear(4, 1))
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
rng = np.random.default_rng(rank)
for step in range(3):
    if scenario == "stop" and rank == 1 and step == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    x = paddle.to_tensor(rng.normal(size=(8, 4)).astype("float32"))
    loss = paddle.mean(model(x) ** 2)
    loss.backward()
    opt.step()
    opt.clear_grad()
    if scenario == "skip" and rank == 1 and step == 1:
        while not os.path.exists("go-on"):  # skipped the all_reduce; waits for a file
            time.sleep(0.5)
    dist.all_reduce(loss)                   # the mean loss, for the log
    print(f"rank {rank} step {step}", flush=True)
dist.barrier()
