"""Click-through-rate model in parameter-server mode: a distributed sparse embedding (the seeds'
``is_distributed`` + ``is_sparse``) feeding a small dense network, on synthetic data.

    fluidctl train --mode pserver --pservers 2 --nproc 2 templates/train_pserver.py --steps 500

    # from files, sharded by fluidctl shard-data (pserver mode needs no equal counts)
    python templates/train_pserver.py --write-data ctr.txt
    fluidctl shard-data ctr.txt --trainers 2 -o ctr-shards
    fluidctl train --mode pserver --pservers 2 --nproc 2 templates/train_pserver.py --data ctr-shards

Each trainer reads its own shard of the data (by PADDLE_TRAINER_ID). Dense parameters go
through ``rt.DistributedOptimizer`` (in pserver mode it hands them to
``fluidctl.runtime.pserver.client.PServerOptimizer``: push gradients, pull parameters); the
embedding's rows are pulled per batch and only the touched rows are pushed back. Sync or async is the pservers' mode (FLUIDCTL_SYNC_MODE);
this script is the same for both. Plain numpy, no framework needed.
"""
import argparse
import sys

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import optim

FIELDS, DENSE = 8, 4            # categorical fields per example, dense features per example
VALUES_PER_FIELD = 1000


def synthetic_batch(rng, batch):
    """Ids are large int64s (field * 1_000_003 + a Zipf-ish value); the label follows a hidden
    per-id weight plus a dense term, so there is something to learn."""
    values = np.minimum(rng.zipf(1.3, size=(batch, FIELDS)), VALUES_PER_FIELD) - 1
    ids = np.arange(FIELDS, dtype=np.int64) * 1_000_003 + values
    dense = rng.standard_normal((batch, DENSE))
    hidden = np.sin(ids * 0.618).sum(1) * 0.8 + dense @ np.array([1.0, -1.0, 0.5, 0.0])
    labels = (rng.random(batch) < 1 / (1 + np.exp(-hidden))).astype(np.float64)
    return ids, dense, labels[:, None]


def write_data(path: str, examples: int, seed: int = 7) -> None:
    """``label,dense1..dense4,id1..id8`` per line (what ``--data`` reads back)."""
    ids, dense, labels = synthetic_batch(np.random.default_rng(seed), examples)
    with open(path, "w") as f:
        for i in range(examples):
            f.write(f"{int(labels[i, 0])}," + ",".join(f"{v:.6g}" for v in dense[i]) + ","
                    + ",".join(str(v) for v in ids[i]) + "\n")


def shard_batches(directory: str, batch: int):
    """Endless batches from this trainer's shard (fluidctl.runtime.data.ShardReader)."""
    from fluidctl.runtime.data import ShardReader
    reader = ShardReader(directory, batch_size=batch, drop_last=True)
    while True:
        for lines in reader:
            rows = [line.split(",") for line in lines]
            labels = np.array([[float(r[0])] for r in rows])
            dense = np.array([[float(v) for v in r[1:1 + DENSE]] for r in rows])
            ids = np.array([[int(v) for v in r[1 + DENSE:]] for r in rows], dtype=np.int64)
            yield ids, dense, labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="batches per trainer, e.g. 500")
    p.add_argument("--batch", type=int, default=64, help="examples per batch, e.g. 128")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate, e.g. 0.1")
    p.add_argument("--emb-dim", type=int, default=8, help="embedding width, e.g. 16")
    p.add_argument("--hidden", type=int, default=32, help="hidden units, e.g. 64")
    p.add_argument("--dict-size", type=int, default=100_000,
                   help="most distinct ids the embedding may hold, e.g. 1000000")
    p.add_argument("--data", metavar="DIR",
                   help="read batches from this trainer's shard of a fluidctl shard-data "
                        "directory instead of generating them, e.g. --data shards")
    p.add_argument("--write-data", metavar="FILE",
                   help="write N generated examples (--examples) to FILE and exit")
    p.add_argument("--examples", type=int, default=20000, help="with --write-data, e.g. 50000")
    args = p.parse_args(argv)
    if args.write_data:
        write_data(args.write_data, args.examples)
        return

    ctx = rt.init()
    if ctx.mode != "pserver":
        sys.exit("error: not in pserver mode (run with fluidctl train --mode pserver)")
    env = ctx.env
    rng = np.random.default_rng(1234)               # same initial weights on every trainer
    width = FIELDS * args.emb_dim + DENSE
    params = {
        "fc1.w": rng.standard_normal((width, args.hidden)) * (2 / width) ** 0.5,
        "fc1.b": np.zeros(args.hidden),
        "fc2.w": rng.standard_normal((args.hidden, 1)) * 0.1,
        "fc2.b": np.zeros(1),
    }
    opt = rt.DistributedOptimizer(params, optimizer=optim.SGD(args.lr), ctx=ctx)
    emb = opt.sparse_table("ctr.emb", dim=args.emb_dim, dict_size=args.dict_size,
                           dtype="float64", scale=0.05)
    data = np.random.default_rng(100 + env.rank)     # this trainer's shard of the data
    from_files = shard_batches(args.data, args.batch) if args.data else None
    losses = []
    for step in range(args.steps):
        ids, dense, y = next(from_files) if from_files else synthetic_batch(data, args.batch)
        e = emb.pull(ids)                                         # (B, FIELDS, emb_dim)
        x = np.concatenate([e.reshape(len(ids), -1), dense], axis=1)
        z1 = x @ params["fc1.w"] + params["fc1.b"]
        a1 = np.maximum(z1, 0)
        logit = a1 @ params["fc2.w"] + params["fc2.b"]
        prob = 1 / (1 + np.exp(-logit))
        losses.append(float(-np.mean(y * np.log(prob + 1e-12)
                                     + (1 - y) * np.log(1 - prob + 1e-12))))
        # backward
        d_logit = (prob - y) / len(y)
        d_a1 = d_logit @ params["fc2.w"].T
        d_z1 = d_a1 * (z1 > 0)
        grads = {"fc2.w": a1.T @ d_logit, "fc2.b": d_logit.sum(0),
                 "fc1.w": x.T @ d_z1, "fc1.b": d_z1.sum(0)}
        d_x = d_z1 @ params["fc1.w"].T
        # each row sees few examples: push its summed (not batch-averaged) gradient
        emb.push(ids, d_x[:, :FIELDS * args.emb_dim].reshape(e.shape) * len(y))
        global_step = opt.step(grads)
        if step % 50 == 0 or step == args.steps - 1:
            recent = np.mean(losses[-50:])
            print(f"trainer {env.rank} step {step} loss {recent:.4f} "
                  f"(global step {global_step})", flush=True)
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    print(f"trainer {env.rank} done: loss {first:.4f} -> {last:.4f}", flush=True)
    opt.close()
    rt.finalize()


if __name__ == "__main__":
    main()
