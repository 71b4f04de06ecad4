"""One rank of the runtime tests: ``python runtime_worker.py SCENARIO [transport]``.

Prints one ``RESULT <json>`` line that the test reads; exits non-zero on an unexpected error.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import CollectiveError

TIMEOUT = float(os.environ.get("TEST_TIMEOUT", "20"))


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def ops(ctx):
    r, n = ctx.rank, ctx.world_size
    out = {"transport": ctx.transport}
    for dtype in ("float32", "float64", "int64", "float16", "int8", "uint8"):
        x = (np.arange(12, dtype=dtype).reshape(3, 4) + r)
        s = ctx.allreduce(x.copy(), "sum")
        mx = ctx.allreduce(x.copy(), "max")
        mn = ctx.allreduce(x.copy(), "min")
        expect = sum(np.arange(12, dtype=dtype).reshape(3, 4) + k for k in range(n))
        out[f"sum_{dtype}"] = bool(np.array_equal(s, expect) and s.dtype == x.dtype)
        out[f"max_{dtype}"] = bool(np.array_equal(mx, np.arange(12).reshape(3, 4) + n - 1))
        out[f"min_{dtype}"] = bool(np.array_equal(mn, np.arange(12).reshape(3, 4)))
    m = ctx.allreduce(np.full(5, float(r), np.float32), "mean")
    out["mean"] = bool(np.allclose(m, (n - 1) / 2) and m.dtype == np.float32)
    # large enough to take several shared-memory chunks and ring pieces
    big = np.arange(3_000_001, dtype=np.float64) * (r + 1)
    ctx.allreduce(big)
    out["big"] = bool(np.array_equal(big, np.arange(3_000_001, dtype=np.float64)
                                     * (n * (n + 1) // 2)))
    fortran = np.asfortranarray(np.ones((4, 3), np.float32) * r)
    ctx.allreduce(fortran)
    out["fortran"] = bool(np.all(fortran == n * (n - 1) / 2))
    for root in range(n):
        b = np.full((2, 3), r * 10 + 1, np.float64)
        ctx.broadcast(b, root=root)
        out[f"bcast_{root}"] = bool(np.all(b == root * 10 + 1))
    g = ctx.allgather(np.array([r, r * r], np.int32))
    out["allgather"] = g.tolist() == [[k, k * k] for k in range(n)] and g.dtype == np.int32
    rs = ctx.reduce_scatter(np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) + r)
    full = sum(np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) + k for k in range(n))
    out["reduce_scatter"] = bool(np.array_equal(rs, full[2 * r: 2 * r + 2]))
    red = np.full(3, r + 1.0)
    ctx.reduce(red, root=n - 1)
    out["reduce"] = bool(r != n - 1 or np.all(red == n * (n + 1) / 2))
    empty = np.zeros((0, 3), np.float32)
    ctx.allreduce(empty)
    out["empty"] = empty.shape == (0, 3)
    ctx.barrier()
    out["barrier"] = True
    # shared memory is plain mmap: nothing for multiprocessing's resource_tracker to unlink
    out["no_tracker_module"] = "multiprocessing.resource_tracker" not in sys.modules
    shm = getattr(ctx.comm, "shm", None)
    out["shm_direct"] = None if shm is None else shm._direct     # which path large calls took
    # with the native module: whether it takes every size (no switch to direct reads)
    out["shm_native"] = None if shm is None or shm._native is None else \
        shm.native_limit() > (1 << 40)
    result(**out)


def switch_mismatch(ctx):
    """Sizes on both sides of the shared-memory direct/pipelined switch (4 MiB): the same error
    everywhere, then a good call on the direct path still works."""
    n = (5 << 20) // 4 if ctx.rank == 0 else (3 << 20) // 4
    out = {}
    try:
        ctx.allreduce(np.ones(n, np.float32))
        out["error"] = "no error"
    except CollectiveError as exc:
        out["error"] = str(exc)
    x = np.full((6 << 20) // 8, ctx.rank + 1.0)
    ctx.allreduce(x)
    out["still_works"] = bool(np.all(x == ctx.world_size * (ctx.world_size + 1) / 2))
    result(**out)


def errors(ctx):
    """Every rank must see the same error for each bad call, and the group must stay usable."""
    r = ctx.rank
    cases = {
        "shape": lambda: ctx.allreduce(np.zeros(3 + (r == 1), np.float32)),
        "dtype": lambda: ctx.allreduce(np.zeros(4, np.float64 if r == 1 else np.float32)),
        "unsupported": lambda: ctx.allreduce(np.zeros(4, np.complex64 if r == 0 else np.float32)),
        "op": lambda: ctx.allreduce(np.zeros(4), "max" if r == 1 else "sum"),
        "mean_int": lambda: ctx.allreduce(np.zeros(4, np.int32), "mean"),
        "not_array": lambda: ctx.allreduce([1.0, 2.0] if r == 1 else np.zeros(2)),
        "kind": lambda: ctx.broadcast(np.zeros(2)) if r == 0 else ctx.allreduce(np.zeros(2)),
        "root": lambda: ctx.broadcast(np.zeros(2), root=ctx.world_size),
        "bad_op": lambda: ctx.allreduce(np.zeros(2), "prod"),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = "no error"
        except CollectiveError as exc:
            out[name] = str(exc)
    x = np.ones(4)
    ctx.allreduce(x)
    out["still_works"] = bool(np.all(x == ctx.world_size))
    result(**out)


def agreed_once(ctx):
    """Between nodes a signature is agreed in full once; later calls only compare the ring's
    headers. Counts the full agreements this rank's ring made for 20 calls of 3 signatures."""
    ring = getattr(ctx.comm, "ring", None)
    full = []
    if ring is not None:
        gather = ring.gather_meta
        ring.gather_meta = lambda *a: (full.append(1), gather(*a))[1]
    ok = True
    for i in range(20):
        x, y = np.full(4, ctx.rank + 1.0), np.full((2, 3), i, np.int64)
        ctx.allreduce(x)
        ctx.broadcast(y, root=i % ctx.world_size)
        ok &= bool(np.all(x == ctx.world_size * (ctx.world_size + 1) / 2) and np.all(y == i))
        ok &= bool(np.all(ctx.allgather(np.full(3, ctx.rank)) == np.arange(ctx.world_size)[:, None]))
    ctx.barrier()
    result(ok=ok, full=len(full) if ring is not None else None)


def late_mismatch(ctx):
    """A rank that diverges after a signature was agreed in full (TEST_VARIANT: ``new`` passes a
    shape never agreed, ``agreed`` one agreed before, ``kind`` calls broadcast instead): every
    rank raises the same error, and the communicator stays closed after it."""
    variant, odd = os.environ["TEST_VARIANT"], int(os.environ["TEST_ODD_RANK"])
    for n in (4, 8):
        for _ in range(2):
            ctx.allreduce(np.ones(n))
    mine = ctx.rank == odd
    out = {}
    try:
        if variant == "kind" and mine:
            ctx.broadcast(np.ones(4))
        else:
            ctx.allreduce(np.ones({"new": 5, "agreed": 8}.get(variant, 4) if mine else 4))
        out["error"] = "no error"
    except CollectiveError as exc:
        out["error"] = str(exc)
    try:
        x = np.ones(4)
        ctx.allreduce(x)
        out["after"] = "works" if np.all(x == ctx.world_size) else "wrong"
    except CollectiveError as exc:
        out["after"] = str(exc)
    result(**out)


def die(ctx):
    """The last rank kills itself in the middle of the run; the others must report it."""
    x = np.ones(1000)
    ctx.allreduce(x)
    if ctx.rank == ctx.world_size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(100):
            ctx.allreduce(x)
        result(error="no error")
    except CollectiveError as exc:
        result(error=str(exc))


def stuck(ctx):
    """Rank 1 stays alive but never calls the collective: the others time out naming it."""
    if ctx.rank == 1:
        time.sleep(600)           # killed by the test
        return
    try:
        ctx.allreduce(np.ones(10))
        result(error="no error")
    except CollectiveError as exc:
        result(error=str(exc))


def sgd(ctx):
    """Data-parallel SGD equals single-process full-batch SGD (both strategies, both dtypes)."""
    r, n = ctx.rank, ctx.world_size
    out = {}
    for dtype in (np.float32, np.float64):
        rng = np.random.default_rng(7)
        X = rng.standard_normal((12 * 6, 5)).astype(dtype)
        y = (X @ rng.standard_normal(5) + 0.1).astype(dtype)

        def grad(p, Xb, yb):
            err = Xb @ p["w"] + p["b"] - yb
            return {"w": (Xb.T @ err / len(yb)).astype(dtype),
                    "b": np.array([err.mean()], dtype=dtype)}

        ref = {"w": np.zeros(5, dtype), "b": np.zeros(1, dtype)}
        ref_opt = rt.optim.Momentum(lr=0.05, momentum=0.9)
        for _ in range(8):
            g = grad(ref, X, y)
            for k in ref:
                ref_opt.apply(k, ref[k], g[k])
        for strategy in ("AllReduce", "Reduce"):
            # every rank starts from different values: rank 0's must win
            params = {"w": np.full(5, float(r), dtype), "b": np.full(1, float(r), dtype)}
            params["w"][:] = 0 if r == 0 else params["w"]
            params["b"][:] = 0 if r == 0 else params["b"]
            opt = rt.DistributedOptimizer(
                params, optimizer=rt.optim.Momentum(lr=0.05, momentum=0.9),
                strategy=rt.DistributeStrategy(reduce_strategy=strategy, fuse_grad_size_mb=1e-5))
            shard = slice(r * len(y) // n, (r + 1) * len(y) // n)
            for _ in range(8):
                opt.step(grad(params, X[shard], y[shard]))
            rel = max(float(np.max(np.abs(params[k] - ref[k]) / (np.abs(ref[k]) + 1e-30)))
                      for k in ref)
            out[f"{strategy}_{np.dtype(dtype).name}"] = {
                "rel": rel, "dtype": params["w"].dtype.name, "buckets": len(opt._buckets)}
    result(**out)


def mismatch_params(ctx):
    params = {"w": np.zeros(3 + (ctx.rank == 1), np.float32)}
    try:
        rt.DistributedOptimizer(params, optimizer=rt.optim.SGD(lr=0.1))
        result(error="no error")
    except CollectiveError as exc:
        result(error=str(exc))


def single(ctx):
    x = np.arange(3.0)
    ctx.allreduce(x, "mean")
    g = ctx.allgather(x)
    p = {"w": np.ones(2, np.float32)}
    opt = rt.DistributedOptimizer(p, optimizer=rt.optim.SGD(lr=0.5))
    opt.step({"w": np.ones(2, np.float32)})
    result(x=x.tolist(), g=g.tolist(), w=p["w"].tolist(), world=ctx.world_size,
           mode=ctx.mode, transport=ctx.transport)


def main():
    scenario = sys.argv[1]
    transport = sys.argv[2] if len(sys.argv) > 2 else "auto"
    ctx = rt.init(timeout=TIMEOUT, transport=transport)
    globals()[scenario](ctx)
    if scenario not in ("die", "stuck"):
        rt.finalize()


if __name__ == "__main__":
    main()
