"""The collective communicator a training script talks to through ``Context``.

It turns user arrays into flat in-place buffers plus a metadata record (see ``meta``) and hands
them to the transport picked at start-up:

- ``shm``: every rank on one node, shared memory;
- ``ring``: one rank per node, TCP ring;
- ``hierarchical``: shared memory inside each node, the ring between node leaders;
- ``mpi``: mpi4py's communicator (under mpirun without the PADDLE_* contract);
- ``nccl``: used for CuPy arrays when a GPU communicator exists (cupy arrays without one are
  staged through host memory and take the CPU path).

Between nodes (``ring``, ``hierarchical``) a call's metadata is agreed in full on its first
use; later calls with an agreed signature send a fixed header that each ring member compares with
its neighbour's (see ``ring``), so the check costs the same at any world size.
FLUIDCTL_STRICT_COLLECTIVES=1 agrees on every call in full.

Everything is built on one primitive, an in-place allreduce with metadata agreement:
broadcast is an allreduce where non-roots contribute zeros (x + 0 is exact), allgather reduces a
zero-filled (world, ...) buffer holding each rank's row, reduce_scatter keeps this rank's part.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

__all__ = ["Communicator", "CollectiveError"]


def problem_of(x) -> bool:
    """Whether ``x`` cannot be used as is (the metadata exchange reports it)."""
    return not (isinstance(x, np.ndarray) and x.flags.writeable
                and (x.flags.c_contiguous or x.flags.f_contiguous))


_CUPY_TYPES = {}                 # type -> is it a CuPy array type (one dict lookup per call)


def _is_cupy(x) -> bool:
    t = type(x)
    try:
        return _CUPY_TYPES[t]
    except KeyError:
        found = _CUPY_TYPES[t] = t.__module__.split(".")[0] == "cupy"
        return found


_NATIVE_CHARS = "fdbBhHiIlqLQ?"     # _fastshm.c reduces these (not float16, not bfloat16)
_NATIVE_OPS = {"sum": 0, "mean": 0, "max": 2, "min": 3}     # the reduction, as meta.OPS' index


class _SmallCall:
    """An allreduce signature on the native path: its metadata record (kept alive here, its
    address handed to C) and the numbers the C code takes."""
    __slots__ = ("rec", "addr", "code", "op", "mean", "world", "piece")

    def __init__(self, x, op: str, world: int, piece: int):
        self.rec = meta.record(0, "allreduce", op, x.dtype, x.shape)
        self.addr = self.rec.ctypes.data
        self.code = ord(x.dtype.char)
        self.op = _NATIVE_OPS[op]
        self.mean = op == "mean"
        self.world = x.dtype.type(world)
        self.piece = piece


class Communicator:
    def __init__(self, rank: int, world_size: int, *, shm=None, ring=None, mpi=None,
                 local_ranks: Optional[List[int]] = None, strict: bool = False):
        self.rank, self.world_size = rank, world_size
        self.shm, self.ring, self.mpi = shm, ring, mpi
        self.nccl = None                      # set by init() when a GPU communicator exists
        self.local_ranks = local_ranks or [rank]
        self.is_leader = ring is not None
        self._seq = 0
        self._op = "sum"
        self._records = {}
        self._log = None                      # the GPU path's CallLog (agree.py), made on first use
        self._agreed = set()                  # call keys agreed in full between nodes
        self._fast = False                    # this call's header mode (ring.FAST), for _across
        if mpi is not None:
            self.transport = "mpi"
        elif shm is not None and (ring is not None or world_size > shm.n):
            self.transport = "hierarchical"
        elif shm is not None:
            self.transport = "shm"
        elif ring is not None:
            self.transport = "ring"
        else:
            self.transport = "single"
        # between nodes, a signature agreed once is checked against the ring neighbours only
        self._by_header = self.transport in ("ring", "hierarchical") and not strict
        # one node, the native module built: allreduces below DIRECT_MIN skip the Python path
        self._small = shm.small if self.transport == "shm" and shm._native is not None else None
        self._smalls = {}                     # (dtype, shape, op) -> _SmallCall or None

    @property
    def broken(self) -> bool:
        """A CPU transport is broken (a rank died or left): no exchange can finish."""
        return any(part is not None and part.broken for part in (self.shm, self.ring))

    def close(self) -> None:
        for part in (self.ring, self.shm, self.nccl):
            if part is not None:
                part.close()

    # --- the one primitive -----------------------------------------------------------
    def _flat(self, x):
        """(flat view, problem code): in-place work needs a writable contiguous array."""
        if not isinstance(x, np.ndarray):
            return np.zeros(0, np.uint8), meta.NOT_AN_ARRAY
        if not x.flags.writeable:
            return np.zeros(0, np.uint8), meta.READ_ONLY
        if x.flags.c_contiguous:
            return x.reshape(-1), 0
        if x.flags.f_contiguous:
            return x.T.reshape(-1), 0
        return np.zeros(0, np.uint8), meta.NOT_CONTIGUOUS

    def _run(self, buf, kind: str, op: str, shape, dtype, root: int = 0,
             zero_input: bool = False) -> None:
        """Allreduce ``buf`` in place after every rank agreed on the call's metadata."""
        dt = getattr(buf, "dtype", None)
        if dt is not None and dt.kind == "V" and meta.is_bfloat16(dt) and not problem_of(buf):
            return self._run_bfloat16(buf, kind, op, shape, root, zero_input)
        self._seq += 1
        flat, problem = self._flat(buf)
        key = (kind, op, dtype, shape, root, problem)
        rec = self._records.get(key)
        if rec is None:                         # building a record costs more than a 4 KiB copy
            if len(self._records) > 256:
                self._records.clear()
            rec = self._records[key] = meta.record(0, kind, op, dtype, shape, root, problem)
        rec[meta.SEQ] = self._seq
        reduce_op = "sum" if op == "mean" else op
        fast = self._by_header and key in self._agreed and kind != "barrier"
        self._exchange(flat, rec, reduce_op, zero_input, fast)
        if self._by_header and not fast:      # agreed in full by every rank: headers from now
            if len(self._agreed) > 256:           # the same on every rank: calls agree so far
                self._agreed.clear()
            self._agreed.add(key)
        if op == "mean":
            flat /= flat.dtype.type(self.world_size)

    def _run_bfloat16(self, buf, kind: str, op: str, shape, root: int,
                      zero_input: bool) -> None:
        """bfloat16 on the CPU transports: reduced in float32 (exact for sums of a few
        bfloat16 values, and for max/min) and rounded once at the end, so the result does not
        depend on the order of the partial sums (shm's pieces, the ring's hops)."""
        self._seq += 1
        flat = buf.reshape(-1) if buf.flags.c_contiguous else buf.T.reshape(-1)
        wide = flat.astype(np.float32)
        rec = meta.record(self._seq, kind, op, np.float32, shape, root)
        rec[meta.DTYPE] = meta.BFLOAT16
        self._exchange(wide, rec, "sum" if op == "mean" else op, zero_input)
        if op == "mean":
            wide /= np.float32(self.world_size)
        flat[...] = wide.astype(flat.dtype)

    def _exchange(self, flat, rec, reduce_op: str, zero_input: bool, fast: bool = False) -> None:
        """Agree on ``rec`` with every rank (``fast``: by the ring's headers, the signature
        agreed in full before), then allreduce ``flat`` in place."""
        if self.transport == "single":
            message = meta.check(rec[None])
            if message:
                raise CollectiveError(message)
            if zero_input:
                flat[:] = 0
        elif self.transport == "mpi":
            self.mpi.allreduce(flat, rec, reduce_op, zero_input)
        elif self.transport == "ring":
            header = self.ring.header(fast, rec)
            if not fast:
                self.ring.exchange_header(header)
                table = np.zeros((self.world_size, meta.RECORD), np.int64)
                table[self.rank] = rec
                self.ring.gather_meta(table, [self.rank])
                message = meta.check(table)
                if message:
                    raise CollectiveError(message)
            if zero_input:
                flat[:] = 0
            self.ring.allreduce(flat, reduce_op, header if fast else None)
        else:
            self._op, self._fast = reduce_op, fast
            try:
                self.shm.allreduce(flat, rec, reduce_op, zero_input,
                                   across=self._across if self.is_leader else None, fast=fast)
            except CollectiveError:
                if self.ring is not None and self.shm.broken:
                    self.ring.close()        # let the other nodes hear about it now
                raise

    def gpu_call(self, key, rec, sig: int, full: bool = False) -> int:
        """Only the metadata agreement (the GPU path moves its data with NCCL), in full on a
        signature's first use, then by hash (agree.py); returns the call's number. Every
        rank raises the same CollectiveError on a mismatch."""
        log = self._log
        if log is None:
            log = self._log = self._call_log()
        return log.call(key, rec, sig, full)

    def _call_log(self):
        import os
        from fluidctl import envs
        from fluidctl.runtime.collective.agree import CallLog
        log = CallLog(self, envs.strict_collectives(os.environ))
        if self.nccl is not None:     # compare before the queue of launched work can fill
            log.max_every = max(1, min(log.max_every, self.nccl.work.depth // 2))
        return log

    def verify(self) -> None:
        """Compare the GPU calls' hash on every rank now (barrier, synchronize, checkpoint)."""
        if self._log is not None:
            self._log.verify()

    def synchronize(self) -> None:
        """Wait for this rank's queued GPU collectives, raise their error if any failed, then
        compare the calls' hash with the other ranks: a collective call, on every rank."""
        try:
            self.verify()            # first: a mismatch leaves NCCL work that never ends
        except CollectiveError:
            if self.nccl is not None:    # a rank whose NCCL call failed left: say why
                self.nccl.synchronize()
            raise
        if self.nccl is not None:
            self.nccl.synchronize()

    def coalesced(self):
        """``with comm.coalesced():`` the GPU collectives inside are one NCCL group."""
        if self.nccl is not None:
            return self.nccl.coalesced()
        import contextlib
        return contextlib.nullcontext()

    def _across(self, chunk, table, first: bool) -> None:
        """Hierarchical step on a node leader: agree metadata and reduce between nodes. On the
        first chunk: in full (every rank's record goes round), or by header, where the node's
        ranks agree (``chunk`` is None when they do not) and the leader's record stands for
        them."""
        ring, header = self.ring, None
        if first:
            header = ring.header(self._fast, table[self.rank])
            if self._fast and chunk is None:
                local = self.local_ranks
                ring.fail(meta.check(table[local], False, local) or meta.DIVERGED)
            if not self._fast:
                ring.exchange_header(header)
                header = None
                ring.gather_meta(table, self.local_ranks)
                if meta.check(table):
                    return
        if chunk is not None:
            ring.allreduce(chunk, self._op, header)

    def _small_call(self, x, op: str):
        """What the native path needs for allreduces like ``x`` with ``op``, or None when
        they take the Python path (a dtype or op the C code lacks, a message that the direct
        path moves)."""
        key = (x.dtype, x.shape, op)
        if len(self._smalls) > 256:
            self._smalls.clear()
        dt = x.dtype
        ok = (dt.kind in "fiub" and dt.char in _NATIVE_CHARS and dt.isnative
              and op in _NATIVE_OPS and (op != "mean" or dt.kind == "f")
              and x.nbytes < self.shm.native_limit())
        call = self._smalls[key] = (_SmallCall(x, op, self.world_size,
                                               self.shm.piece_bytes(dt.itemsize))
                                    if ok else None)
        return call

    # --- the API ---------------------------------------------------------------------
    def allreduce(self, x, op: str = "sum"):
        small = self._small
        if small is not None and type(x) is np.ndarray:
            try:
                call = self._smalls[(x.dtype, x.shape, op)]
            except KeyError:
                call = self._small_call(x, op)
            if call is not None:
                self._seq = seq = self._seq + 1
                if small(x, call.addr, seq, call.code, call.op, False, call.piece):
                    if call.mean:
                        x /= call.world
                    return x
                self._seq -= 1                  # not a writable contiguous array
        if _is_cupy(x):
            return self._gpu("allreduce", x, op=op)
        self._run(x, "allreduce", op, getattr(x, "shape", ()), getattr(x, "dtype", np.uint8))
        return x

    def reduce(self, x, root: int = 0, op: str = "sum"):
        """Reduce to ``root``: only root's ``x`` is defined to hold the result afterwards.
        Elsewhere: on CPU transports (an allreduce underneath) the same result, on NCCL the
        rank's own input, untouched (never divided for ``mean``)."""
        if _is_cupy(x):
            return self._gpu("reduce", x, op=op, root=root)
        self._run(x, "reduce", op, getattr(x, "shape", ()), getattr(x, "dtype", np.uint8), root)
        return x

    def broadcast(self, x, root: int = 0):
        if _is_cupy(x):
            return self._gpu("broadcast", x, root=root)
        self._run(x, "broadcast", "sum", getattr(x, "shape", ()),
                  getattr(x, "dtype", np.uint8), root, zero_input=self.rank != root)
        return x

    def allgather(self, x):
        if _is_cupy(x):
            return self._gpu("allgather", x)
        if isinstance(x, np.ndarray) and meta.dtype_code(x.dtype) > 0:
            out = np.zeros((self.world_size,) + x.shape, dtype=x.dtype)
            out[self.rank] = x
        else:
            out = x       # lets every rank learn about the bad input in the metadata exchange
        self._run(out, "allgather", "sum", getattr(x, "shape", ()), getattr(x, "dtype", np.uint8))
        return out

    def reduce_scatter(self, x, op: str = "sum"):
        """Reduce ``x`` (first dimension divisible by world size) across ranks and return this
        rank's 1/world part along the first dimension; ``x`` itself is left unchanged."""
        if _is_cupy(x):
            return self._gpu("reduce_scatter", x, op=op)
        ok = isinstance(x, np.ndarray)
        if ok and (x.ndim == 0 or x.shape[0] % self.world_size):
            # shapes are equal on every rank (checked below), so every rank raises here
            raise CollectiveError(f"reduce_scatter: shape {x.shape} cannot be split in "
                                  f"{self.world_size} along its first dimension")
        buf = np.array(x, copy=True, order="C") if ok else x
        self._run(buf, "reduce_scatter", op, getattr(x, "shape", ()),
                  getattr(x, "dtype", np.uint8))
        part = buf.shape[0] // self.world_size
        return buf[self.rank * part:(self.rank + 1) * part]

    def barrier(self) -> None:
        if self.nccl is not None:
            self.synchronize()
        self._run(np.zeros(0, np.int8), "barrier", "sum", (0,), np.int8)

    # --- GPU -------------------------------------------------------------------------
    def _gpu(self, kind: str, x, **kw):
        if self.nccl is not None:
            return self.nccl.run(kind, x, **kw)
        host = x.get()                          # no NCCL: stage through host memory
        result = getattr(self, kind)(host, **kw)
        if kind in ("allgather", "reduce_scatter"):
            import cupy
            return cupy.asarray(result)
        x.set(host)
        return x
