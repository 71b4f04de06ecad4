"""The pieces of the NCCL path that hold no state: rank 0's unique id in both forms CuPy takes
(``bytes`` in CuPy 14, a tuple of C ``char`` values before, signed or not by machine), NCCL
statuses CuPy cannot name, and the dtype codes and NCCL types of CuPy arrays."""
from __future__ import annotations

import platform
from typing import Optional

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

ID_BYTES = 128
_UNSIGNED_CHAR_MACHINES = ("aarch64", "arm64", "armv7l", "ppc64le", "ppc64", "s390x")


# --- the unique id ------------------------------------------------------------------------
def encode_unique_id(uid) -> bytes:
    """What ``get_unique_id()`` returned (bytes, or a tuple of signed or unsigned chars) as
    the 128 bytes the store carries."""
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(int(v) & 0xFF for v in uid)


def char_is_signed(machine: Optional[str] = None) -> bool:
    return (machine or platform.machine()).lower() not in _UNSIGNED_CHAR_MACHINES


def decode_unique_id(data: bytes, as_bytes: bool, signed: Optional[bool] = None):
    """CuPy 14: ``bytes``; CuPy <= 13: a tuple of C ``char`` values (``signed``: this
    machine's char unless given)."""
    if as_bytes:
        return bytes(data)
    if signed is None:
        signed = char_is_signed()
    return tuple(b - 256 if signed and b > 127 else b for b in data)


def cupy_major(cupy) -> int:
    try:
        return int(str(cupy.__version__).split(".")[0])
    except ValueError:
        return 14


def _wrong_id_type(exc: TypeError) -> bool:
    """Cython's "Argument 'commId' has incorrect type (expected tuple, got bytes)"."""
    return "commId" in str(exc)


def make_communicator(nccl, cupy, world_size: int, rank: int, data: bytes):
    """The id in the form this CuPy's constructor takes: ``bytes`` from CuPy 14 (the
    version says which to try first), a ``tuple`` of C chars before (and in 14.0.0a1); the
    constructor's own type check (TypeError naming commId) decides when the version guessed
    wrong, and the char's signedness is retried on OverflowError."""
    if len(data) != ID_BYTES:
        raise CollectiveError(f"the NCCL unique id in the store has {len(data)} bytes, not "
                              f"{ID_BYTES}: is rank 0 running another CuPy/NCCL?")

    def as_tuple():
        signed = char_is_signed()
        try:
            return nccl.NcclCommunicator(world_size, decode_unique_id(data, False, signed), rank)
        except OverflowError:    # the C char of this CuPy build has the other signedness
            return nccl.NcclCommunicator(world_size, decode_unique_id(data, False, not signed),
                                         rank)

    def as_bytes():
        return nccl.NcclCommunicator(world_size, decode_unique_id(data, True), rank)

    first, second = (as_bytes, as_tuple) if cupy_major(cupy) >= 14 else (as_tuple, as_bytes)
    try:
        return first()
    except TypeError as exc:
        if not _wrong_id_type(exc):
            raise
    return second()


# --- NCCL statuses CuPy cannot name ------------------------------------------------------
# CuPy's NcclError looks its status up in a table that stops at 6 (ncclRemoteError), so newer
# statuses raise KeyError(status) from inside NcclError's constructor.
NCCL_STATUS = {7: "ncclInProgress: the communicator is non-blocking (NCCL_COMM_BLOCKING=0?)",
               8: "ncclTimeout: NCCL's own timeout expired (NCCL >= 2.30)"}


def describe(exc: BaseException) -> str:
    """An exception from a CuPy NCCL call, as one line; a KeyError(int) is a status CuPy's
    NcclError could not name."""
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], int):
        status = exc.args[0]
        return (f"NCCL returned status {status} "
                f"({NCCL_STATUS.get(status, 'unknown to this fluidctl')}), which CuPy's "
                "NcclError cannot name")
    return str(exc) or type(exc).__name__


# --- dtypes -------------------------------------------------------------------------------
_NCCL_TYPE = {"e": "NCCL_FLOAT16", "f": "NCCL_FLOAT32", "d": "NCCL_FLOAT64", "b": "NCCL_INT8",
              "B": "NCCL_UINT8", "i": "NCCL_INT32", "I": "NCCL_UINT32", "l": "NCCL_INT64",
              "L": "NCCL_UINT64", "q": "NCCL_INT64", "Q": "NCCL_UINT64"}


_NCCL_OPS = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


def dtype_code(dtype) -> int:
    """The metadata code of a CuPy array's dtype (negative for what NCCL cannot carry)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "V" and meta.is_bfloat16(dtype):
        return meta.BFLOAT16
    if dtype.char in _NCCL_TYPE and dtype.isnative and (dtype.char not in "lL"
                                                        or dtype.itemsize == 8):
        return ord(dtype.char)
    return -(meta.GPU_UNSUPPORTED + ord(dtype.char))


def nccl_type(nccl, dtype) -> int:
    """Called once per signature (run() caches it by the dtype object)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "V" and meta.is_bfloat16(dtype):
        return nccl.NCCL_BFLOAT16
    return getattr(nccl, _NCCL_TYPE[dtype.char])
