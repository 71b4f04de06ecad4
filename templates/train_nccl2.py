"""A small MLP trained data-parallel in collective (NCCL2) mode, on synthetic data.

    fluidctl train --nproc 2 templates/train_nccl2.py --epochs 5
    python templates/train_nccl2.py                  # one process works too

    # the same data from files, sharded by fluidctl shard-data (equal record counts for NCCL2)
    python templates/train_nccl2.py --write-data train.txt
    fluidctl shard-data train.txt --trainers 2 -o shards --equalize pad
    fluidctl train --nproc 2 templates/train_nccl2.py --data shards

The data set is generated the same way on every trainer (a fixed seed and a hidden "teacher"
network labelling random points); each trainer then takes its own contiguous shard. Parameters
start on trainer 0 and are broadcast by DistributedOptimizer, which also averages gradients every
step, so N trainers with batch B train like one process with batch N*B. numpy on CPU; CuPy when
the launcher gave this rank a GPU (ctx.xp). Loss and accuracy over the whole training set are
printed by rank 0 after each epoch.
"""
import argparse
import time

import numpy as np

import fluidctl.runtime as rt


def make_data(samples: int, features: int, classes: int, seed: int):
    """Points labelled by a fixed random two-layer teacher: learnable, not linearly trivial."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features))
    teacher1 = rng.standard_normal((features, 32))
    teacher2 = rng.standard_normal((32, classes))
    y = np.argmax(np.tanh(x @ teacher1) @ teacher2, axis=1)
    return x, y


def write_data(path: str, x, y) -> None:
    """One record per line: ``label,x1,...,xF`` (what ``--data`` reads back)."""
    with open(path, "w") as f:
        for label, row in zip(y, x):
            f.write(f"{label}," + ",".join(f"{v:.6g}" for v in row) + "\n")


def read_shard(directory: str, ctx, dtype):
    """This trainer's shard of a ``fluidctl shard-data`` directory, as (x, y) arrays; every
    trainer keeps the smallest shard's count so all take the same number of steps."""
    from fluidctl.runtime.data import iter_records, shard_path
    rows = np.array([[float(v) for v in line.split(",")]
                     for line in iter_records(shard_path(directory))])
    count = np.array([len(rows)], dtype=np.int64)
    ctx.allreduce(count, op="min")
    rows = rows[:int(count[0])]
    return rows[:, 1:].astype(dtype), rows[:, 0].astype(np.int64)


def init_params(features, hidden, classes, dtype, seed):
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((features, hidden)) * np.sqrt(2 / features)).astype(dtype),
            "b1": np.zeros(hidden, dtype),
            "w2": (rng.standard_normal((hidden, classes)) * np.sqrt(1 / hidden)).astype(dtype),
            "b2": np.zeros(classes, dtype)}


def forward(p, x, xp):
    h = xp.maximum(x @ p["w1"] + p["b1"], 0)
    logits = h @ p["w2"] + p["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = xp.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return h, probs


def loss_and_grads(p, x, y, xp):
    """Mean softmax cross-entropy over the batch and its gradients (hand-written backprop)."""
    h, probs = forward(p, x, xp)
    n = x.shape[0]
    rows = xp.arange(n)
    loss = -xp.log(probs[rows, y] + 1e-12).mean()
    d_logits = probs
    d_logits[rows, y] -= 1
    d_logits /= n
    d_h = (d_logits @ p["w2"].T) * (h > 0)
    grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(0),
             "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return loss, grads


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5, help="passes over the data, e.g. 10")
    ap.add_argument("--batch", type=int, default=32, help="examples per trainer per step, e.g. 64")
    ap.add_argument("--lr", type=float, default=0.1, help="learning rate, e.g. 0.05")
    ap.add_argument("--hidden", type=int, default=64, help="hidden units, e.g. 128")
    ap.add_argument("--samples", type=int, default=4096, help="data set size, e.g. 20000")
    ap.add_argument("--features", type=int, default=16, help="input width, e.g. 32")
    ap.add_argument("--classes", type=int, default=4, help="number of classes, e.g. 10")
    ap.add_argument("--optimizer", default="momentum", choices=["sgd", "momentum", "adam"],
                    help="update rule, e.g. --optimizer adam")
    ap.add_argument("--strategy", default="AllReduce", choices=["AllReduce", "Reduce"],
                    help="gradient reduce strategy, e.g. --strategy Reduce")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="parameter dtype, e.g. float64")
    ap.add_argument("--seed", type=int, default=1, help="data seed, e.g. 7")
    ap.add_argument("--data", metavar="DIR",
                    help="train on this trainer's shard of a fluidctl shard-data directory "
                         "instead of generated data, e.g. --data shards")
    ap.add_argument("--save-params", metavar="FILE",
                    help="rank 0 writes the trained parameters to FILE (.npz), e.g. w.npz")
    ap.add_argument("--write-data", metavar="FILE",
                    help="write the generated data set to FILE (label,x1,...) and exit")
    args = ap.parse_args(argv)

    if args.write_data:
        write_data(args.write_data, *make_data(args.samples, args.features, args.classes,
                                               args.seed))
        return
    ctx = rt.init()
    xp = ctx.xp
    if args.data:
        x_np, y_np = read_shard(args.data, ctx, args.dtype)
        args.features = x_np.shape[1]
        args.classes = max(args.classes, int(y_np.max()) + 1)
    else:
        x_all, y_all = make_data(args.samples, args.features, args.classes, args.seed)
        per = args.samples // ctx.world_size                  # equal shards: equal step counts
        shard = slice(ctx.rank * per, (ctx.rank + 1) * per)
        x_np, y_np = x_all[shard].astype(args.dtype), y_all[shard]
    per = len(y_np)
    x, y = xp.asarray(x_np), xp.asarray(y_np)

    # different on every rank on purpose: DistributedOptimizer broadcasts trainer 0's
    params = {k: xp.asarray(v) for k, v in
              init_params(args.features, args.hidden, args.classes, args.dtype,
                          seed=100 + ctx.rank).items()}
    rule = {"sgd": rt.optim.SGD(lr=args.lr),
            "momentum": rt.optim.Momentum(lr=args.lr, momentum=0.9),
            "adam": rt.optim.Adam(lr=args.lr / 10)}[args.optimizer]
    opt = rt.DistributedOptimizer(params, optimizer=rule,
                                  strategy=rt.DistributeStrategy(reduce_strategy=args.strategy))
    if ctx.rank == 0:
        print(f"{ctx.world_size} trainer(s), transport {ctx.transport}, device {ctx.device}, "
              f"{per} examples each, global batch {args.batch * ctx.world_size}", flush=True)

    order_rng = np.random.default_rng(1000 + ctx.rank)
    steps = per // args.batch
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = xp.asarray(order_rng.permutation(per))
        for step in range(steps):
            idx = order[step * args.batch:(step + 1) * args.batch]
            _, grads = loss_and_grads(params, x[idx], y[idx], xp)
            opt.step(grads)
        # whole-data metrics: every trainer scores its shard, the sums are allreduced
        _, probs = forward(params, x, xp)
        rows = xp.arange(per)
        totals = np.array([float(-xp.log(probs[rows, y] + 1e-12).sum()),
                           float((probs.argmax(1) == y).sum()), float(per)])
        ctx.allreduce(totals)
        if ctx.rank == 0:
            print(f"epoch {epoch}: loss {totals[0] / totals[2]:.4f} "
                  f"accuracy {totals[1] / totals[2]:.3f} ({time.perf_counter() - start:.2f}s)",
                  flush=True)
    if args.save_params and ctx.rank == 0:
        save_params(args.save_params, params)
    rt.finalize()


def save_params(path: str, params) -> None:
    """An .npz of the parameters (CuPy arrays copied to the host), renamed into place."""
    import os
    tmp = f"{path}.tmp{os.getpid()}.npz"
    np.savez(tmp, **{k: v.get() if hasattr(v, "get") else v for k, v in params.items()})
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
