"""mpi4py programs of the usual shapes, for checking that every launch path keeps mpirun's world.

    python mpi_shapes.py OUTDIR SHAPE [SHAPE ...]      (hello, ring, pingpong, pi)

Each rank writes OUTDIR/<shape>.<rank>.json with what it computed, so launch paths can be
compared exactly. pingpong and barrier insist on at least 2 processes, as the OSU benchmarks do.
"""
import json
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
outdir, shapes = sys.argv[1], sys.argv[2:]


def hello():
    print(f"Hello, World! I am process {rank} of {size} on {MPI.Get_processor_name()}.")
    return {"rank": rank, "size": size}


def ring():
    """Pass a token around the ring, each rank adding its rank (mpi4py's ring demo)."""
    token = 0 if rank == 0 else comm.recv(source=rank - 1, tag=7)
    token += rank
    comm.send(token, dest=(rank + 1) % size, tag=7)
    if rank == 0:
        token = comm.recv(source=size - 1, tag=7)
    return {"token": token if rank == 0 else None, "seen": True}


def pingpong():
    if size < 2:
        print("This test requires at least two processes", file=sys.stderr)
        sys.exit(1)
    comm.Barrier()
    buf = bytearray(1024)
    iterations = 100
    for i in range(iterations):
        if rank == 0:
            buf[0] = i % 256
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
            assert buf[0] == (i + 1) % 256
        elif rank == 1:
            comm.Recv(buf, source=0)
            buf[0] = (buf[0] + 1) % 256
            comm.Send(buf, dest=0)
    comm.Barrier()
    return {"iterations": iterations, "last": buf[0] if rank < 2 else None}


def pi():
    """Midpoint rule for 4/(1+x^2) on [0, 1], the intervals split over the ranks, reduced."""
    n = 100000
    h = 1.0 / n
    local = sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(rank, n, size)) * h
    total = comm.reduce(local, op=MPI.SUM, root=0)
    return {"pi": round(total, 12) if rank == 0 else None, "size": size}


for shape in shapes:
    result = {"hello": hello, "ring": ring, "pingpong": pingpong, "pi": pi}[shape]()
    with open(os.path.join(outdir, f"{shape}.{rank}.json"), "w") as f:
        json.dump(result, f)
seen = {k: os.environ.get(k) for k in ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
                                       "PADDLE_TRAINER_ENDPOINTS")}
if seen["PADDLE_TRAINER_ID"] is not None:     # under fluidctl: its runtime works beside MPI
    import numpy as np
    import fluidctl.runtime as rt
    ctx = rt.init()
    x = np.full(4, float(ctx.rank + 1))
    ctx.allreduce(x)
    seen["runtime"] = [ctx.rank, ctx.world_size, x.tolist()]
    seen["through_node"] = bool(ctx.env.node_join)       # one join per node at the store
    seen["joins"] = ctx._server.requests.get("join") if ctx._server else None
    rt.finalize()
with open(os.path.join(outdir, f"contract.{rank}.json"), "w") as f:
    json.dump(seen, f)
