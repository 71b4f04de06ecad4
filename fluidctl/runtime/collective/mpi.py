"""Collectives through mpi4py, for ranks started by mpirun without the PADDLE_* contract.

Same interface as the other transports: the metadata records are gathered first (Allgather of
12 int64s) so a mismatch is one clear error everywhere, then one in-place buffer Allreduce.
float16 has no MPI datatype: it is reduced in float32 and rounded back.
"""
from __future__ import annotations

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError


class MpiTransport:
    def __init__(self, comm=None):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.n = self.comm.Get_size()

    def close(self) -> None:
        pass

    def allreduce(self, flat: np.ndarray, rec: np.ndarray, op: str, zero_input: bool) -> None:
        table = np.empty((self.n, meta.RECORD), np.int64)
        self.comm.Allgather(rec, table)
        message = meta.check(table)
        if message:
            raise CollectiveError(message)
        if zero_input:
            flat[:] = 0
        if not flat.size:
            return
        MPI = self.MPI
        if flat.dtype == np.bool_:
            mpi_op = {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND}[op]
        else:
            mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        if flat.dtype == np.float16:
            wide = flat.astype(np.float32)
            self.comm.Allreduce(MPI.IN_PLACE, wide, op=mpi_op)
            flat[:] = wide
        else:
            self.comm.Allreduce(MPI.IN_PLACE, flat, op=mpi_op)
