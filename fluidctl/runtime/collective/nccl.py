"""NCCL through ``cupy.cuda.nccl`` for CuPy arrays (GPU ranks).

Rank 0 creates the unique id and publishes it through the rendezvous store. CuPy 14 takes the id
as ``bytes``, older versions as a tuple of signed chars: the store always carries bytes and
``decode_unique_id`` gives each rank the form its CuPy wants (falling back to the other form if
the constructor refuses). Collectives agree on the metadata records first, with one small
allGather on the device, then run the NCCL call on the current stream.
"""
from __future__ import annotations

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

ID_KEY = "nccl/unique_id"


def encode_unique_id(uid) -> bytes:
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(int(v) & 0xFF for v in uid)


def decode_unique_id(data: bytes, as_bytes: bool):
    if as_bytes:
        return bytes(data)
    return tuple(b - 256 if b > 127 else b for b in data)


def wants_bytes(cupy) -> bool:
    try:
        return int(str(cupy.__version__).split(".")[0]) >= 14
    except ValueError:
        return True


def make_communicator(nccl, cupy, world_size: int, rank: int, data: bytes):
    first = wants_bytes(cupy)
    try:
        return nccl.NcclCommunicator(world_size, decode_unique_id(data, first), rank)
    except TypeError:
        return nccl.NcclCommunicator(world_size, decode_unique_id(data, not first), rank)


class NcclTransport:
    def __init__(self, store, rank: int, world_size: int, timeout: float):
        import cupy
        from cupy.cuda import nccl
        self.cupy, self.nccl = cupy, nccl
        self.rank, self.n = rank, world_size
        if rank == 0:
            store.set(ID_KEY, encode_unique_id(nccl.get_unique_id()))
        data = store.get(ID_KEY, timeout)
        self.comm = make_communicator(nccl, cupy, world_size, rank, data)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None and hasattr(comm, "destroy"):
            comm.destroy()

    def _dtype(self, dtype):
        nccl = self.nccl
        table = {"e": nccl.NCCL_FLOAT16, "f": nccl.NCCL_FLOAT32, "d": nccl.NCCL_FLOAT64,
                 "b": nccl.NCCL_INT8, "B": nccl.NCCL_UINT8, "i": nccl.NCCL_INT32,
                 "l": nccl.NCCL_INT64, "q": nccl.NCCL_INT64}
        return table[np.dtype(dtype).char]

    def run(self, kind: str, x, seq: int, op: str = "sum", root: int = 0):
        cp, nccl = self.cupy, self.nccl
        stream = cp.cuda.get_current_stream().ptr
        problem = 0 if x.flags.c_contiguous else meta.NOT_CONTIGUOUS
        if not problem and np.dtype(x.dtype).char not in "efdbBilq":
            problem = -ord(np.dtype(x.dtype).char)
        rec = cp.asarray(meta.record(seq, kind, op, x.dtype, x.shape, root, problem))
        table = cp.empty((self.n, meta.RECORD), dtype=cp.int64)
        self.comm.allGather(rec.data.ptr, table.data.ptr, meta.RECORD, nccl.NCCL_INT64, stream)
        message = meta.check(cp.asnumpy(table))
        if message:
            raise CollectiveError(message)
        dt, count, ptr = self._dtype(x.dtype), x.size, x.data.ptr
        red = {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "max": nccl.NCCL_MAX,
               "min": nccl.NCCL_MIN}[op]
        if kind == "allreduce":
            self.comm.allReduce(ptr, ptr, count, dt, red, stream)
        elif kind == "reduce":
            self.comm.reduce(ptr, ptr, count, dt, red, root, stream)
        elif kind == "broadcast":
            self.comm.broadcast(ptr, ptr, count, dt, root, stream)
        elif kind == "allgather":
            out = cp.empty((self.n,) + tuple(x.shape), dtype=x.dtype)
            self.comm.allGather(ptr, out.data.ptr, count, dt, stream)
            return out
        elif kind == "reduce_scatter":
            if x.ndim == 0 or x.shape[0] % self.n:
                raise CollectiveError(f"reduce_scatter: shape {x.shape} cannot be split in "
                                      f"{self.n} along its first dimension")
            out = cp.empty((x.shape[0] // self.n,) + tuple(x.shape[1:]), dtype=x.dtype)
            self.comm.reduceScatter(ptr, out.data.ptr, out.size, dt, red, stream)
            if op == "mean":
                out /= self.n
            return out
        if op == "mean":
            x /= self.n
        return x
