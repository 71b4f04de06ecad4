"""bfloat16 on every transport (issue 26, 5): ``python tests/scripts/bf16_worker.py [TRANSPORT]``;
prints one RESULT line of JSON per rank."""
import json
import sys

import ml_dtypes
import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import CollectiveError

bf16 = ml_dtypes.bfloat16
ctx = rt.init(transport=sys.argv[1] if len(sys.argv) > 1 else "auto")
out = {"transport": ctx.transport}
# 256 + 1 + 1: rounded after each partial sum bfloat16 gives 256; rounded once, 258
x = np.array([256.0 if ctx.rank == 0 else 1.0, 1.5, -3.0], bf16)
ctx.allreduce(x)
out["sum"] = x.astype(np.float64).tolist()
y = np.array([ctx.rank + 1.0, 2.0 * ctx.rank], bf16)
ctx.allreduce(y, op="mean")
out["mean"] = y.astype(np.float64).tolist()
m = np.array([float(ctx.rank)], bf16)
ctx.allreduce(m, op="max")
out["max"] = float(m[0])
g = ctx.allgather(np.array([ctx.rank + 0.5], bf16))
out["gather"] = g.astype(np.float64).reshape(-1).tolist()
b = np.array([7.0 if ctx.rank == 0 else 0.0], bf16)
ctx.broadcast(b, root=0)
out["bcast"] = float(b[0])
params = {"w": np.full(4, 1.0, bf16)}
opt = rt.DistributedOptimizer(params, optimizer=rt.optim.SGD(lr=0.5))
opt.step({"w": np.full(4, float(ctx.rank + 1), bf16)})
out["w"] = params["w"].astype(np.float64).tolist()
out["w_dtype"] = params["w"].dtype.name
try:
    ctx.allreduce(np.zeros(2, ml_dtypes.float8_e4m3fn))
except CollectiveError as exc:
    out["float8"] = str(exc)
print("RESULT " + json.dumps(out), flush=True)
rt.finalize()
