"""One rank of the same-node fast-path tests: ``python shm_worker.py SCENARIO [CASES_FILE]``.

Prints one ``RESULT <json>`` line that the test reads; exits non-zero on an unexpected error.
"""
import json
import os
import sys
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import CollectiveError

REDUCE = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def data(case, rank):
    """Rank ``rank``'s input for ``case`` (dtype, shape, op, seed), the same on every rank."""
    dtype, shape, _, seed = case
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal(shape) * 100
        x[rng.random(shape) < 0.05] = np.nan if seed % 3 == 0 else 0.0
    elif np.dtype(dtype).kind == "b":
        x = rng.random(shape) < 0.5
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return np.asarray(x, dtype=dtype)


def cases(ctx):
    """Every case of the file: the allreduce against numpy's reduction of every rank's input
    (in rank order, as both of fluidctl's paths reduce)."""
    with open(sys.argv[2]) as f:
        todo = json.load(f)
    wrong = []
    for case in todo:
        dtype, shape, op, _ = case
        x = data(case, ctx.rank)
        expect = data(case, 0)
        with np.errstate(all="ignore"):
            for r in range(1, ctx.world_size):
                expect = REDUCE[op](expect, data(case, r))
            if op == "mean":
                expect = expect / expect.dtype.type(ctx.world_size)
        out = ctx.allreduce(x, op)
        if out is not x or not np.array_equal(x, expect, equal_nan=x.dtype.kind == "f"):
            wrong.append(case)
    result(wrong=wrong, native=ctx.comm.shm._native is not None, calls=len(todo))


def after_many(ctx):
    """Many agreeing calls, then a mismatch: named on every rank, and the group works on."""
    x = np.ones(1024, np.float32)
    for _ in range(500):
        ctx.allreduce(x)
    out = {}
    wrong = {
        "shape": lambda: ctx.allreduce(np.zeros(1024 + ctx.rank, np.float32)),
        "dtype_native_vs_python": lambda: ctx.allreduce(
            np.zeros(8, np.float16 if ctx.rank else np.float32)),
        "read_only": lambda: ctx.allreduce(_read_only(ctx.rank == 1)),
        "op": lambda: ctx.allreduce(np.zeros(8), "max" if ctx.rank else "min"),
    }
    for name, call in wrong.items():
        try:
            call()
            out[name] = "no error"
        except CollectiveError as exc:
            out[name] = str(exc)
    y = np.ones(16)
    ctx.allreduce(y)
    out["still_works"] = bool(np.all(y == ctx.world_size))
    result(**out)


def _read_only(frozen: bool):
    x = np.zeros(8)
    x.flags.writeable = not frozen
    return x


def late(ctx):
    """Rank 1 comes late (longer than a wait's slice): rank 0 resumes its call and both get
    the right sum."""
    x = np.full(100, ctx.rank + 1.0)
    if ctx.rank == 1:
        time.sleep(0.7)
    began = time.perf_counter()
    ctx.allreduce(x)
    result(ok=bool(np.all(x == 3.0)), waited=time.perf_counter() - began)


def main():
    ctx = rt.init(timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
    globals()[sys.argv[1]](ctx)
    rt.finalize()


if __name__ == "__main__":
    main()
