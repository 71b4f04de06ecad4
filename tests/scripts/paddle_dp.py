"""An unmodified PaddlePaddle data-parallel script (CPU, gloo), as users write it.

    fluidctl train --nproc 2 tests/scripts/paddle_dp.py
"""
import numpy as np
import paddle
import paddle.distributed as dist

paddle.set_device("cpu")
dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()

paddle.seed(2024)
model = paddle.nn.Linear(4, 1)
dp_model = paddle.DataParallel(model)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=dp_model.parameters())

rng = np.random.default_rng(rank)
x = paddle.to_tensor(rng.normal(size=(8, 4)).astype("float32"))
y = paddle.to_tensor(rng.normal(size=(8, 1)).astype("float32"))
for step in range(3):
    loss = paddle.mean((dp_model(x) - y) ** 2)
    loss.backward()
    opt.step()
    opt.clear_grad()

t = paddle.to_tensor([float(rank + 1)])
dist.all_reduce(t)
weights = model.weight.numpy().ravel().tolist()
print(f"paddle rank {rank}/{world} allreduce {t.numpy()[0]:.1f} weights {weights}", flush=True)
