"""What every collective call exchanges before any data moves: a fixed-size record per rank.

Each rank describes its call (sequence number, kind, op, dtype, shape, root) in 12 int64s. The
transports gather all records first and every rank runs the same ``check`` on the same table, so a
mismatch (shape, dtype, op, a rank calling a different collective) or an unsupported dtype gives
the same clear error on every rank instead of a hang or silently mixed data.
"""
from __future__ import annotations

import zlib
from typing import Optional, Sequence

import numpy as np

RECORD = 12
SEQ, KIND, OP, DTYPE, NBYTES, ROOT, NDIM, DIM0, CRC = 0, 1, 2, 3, 4, 5, 6, 7, 11
MAX_DIMS = CRC - DIM0

KINDS = ["allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "reduce",
         "check of the collective calls"]
CHECK = KINDS.index("check of the collective calls")   # the periodic hash comparison (agree.py)
# a table where one rank compares hashes while another agrees on a call it sees for the first
# time: the ranks' calls diverged; the communicator names the first diverging call
DIVERGED = "the ranks' collective calls diverged"
OPS = ["sum", "mean", "max", "min"]
SUPPORTED = "efdbhilqBHILQ?"     # dtype.char: float16/32/64, (u)int8..64, bool
NOT_AN_ARRAY, NOT_CONTIGUOUS, READ_ONLY, WRONG_DEVICE = -1, -2, -3, -4  # unusable inputs
# GPU (NCCL) path: bfloat16 has no numpy char of its own; dtypes NCCL lacks get their own codes
BFLOAT16 = 0x10000 + ord("E")
GPU_UNSUPPORTED = 0x20000                 # -(GPU_UNSUPPORTED + ord(char)): not an NCCL type
GPU_DTYPES = "float16/32/64, bfloat16, int8, uint8, int32, uint32, int64 or uint64"
_PROBLEMS = {NOT_AN_ARRAY: "something that is not a numpy/cupy array",
             WRONG_DEVICE: "a CuPy array on another GPU than its own (make arrays after "
                           "rt.init(), in the thread that called it, or inside "
                           "`with cupy.cuda.Device(ctx.device_id):`)",
             NOT_CONTIGUOUS: "a non-contiguous array (collectives work in place: pass a "
                             "contiguous one, e.g. np.ascontiguousarray)",
             READ_ONLY: "a read-only array (collectives work in place)"}


class CollectiveError(RuntimeError):
    """A collective could not complete; raised on every rank with the same explanation."""


CPU_DTYPES = "float16/32/64, bfloat16, int8-64, uint8-64 or bool"


_BF16 = {}          # dtype object -> is it bfloat16 (dtype.name runs Python code in numpy 2.x)


def is_bfloat16(dtype) -> bool:
    """ml_dtypes.bfloat16 (kind 'V', str '<V2': only its name tells it apart); one dict
    lookup by the dtype object after the first call."""
    try:
        return _BF16[dtype]
    except KeyError:
        if len(_BF16) > 256:
            _BF16.clear()
        found = _BF16[dtype] = getattr(dtype, "name", "") == "bfloat16"
        return found
    except TypeError:                            # unhashable: not a dtype
        return False


def dtype_code(dtype: np.dtype) -> int:
    """ord(dtype.char) for native-order supported dtypes (BFLOAT16 for bfloat16), else a
    negative 'unsupported' code."""
    if dtype.kind == "V" and is_bfloat16(dtype):
        return BFLOAT16
    if dtype.char in SUPPORTED and dtype.isnative:
        return ord(dtype.char)
    return -ord(dtype.char)


_NAME = slice(DIM0, CRC)          # an unsupported dtype's name travels where its shape would


def pack_name(rec: np.ndarray, dtype) -> None:
    """Write ``dtype``'s name into ``rec`` (for a dtype the others cannot name from its code:
    ml_dtypes' float8 types, a byte-swapped array)."""
    dtype = np.dtype(dtype)
    name = (dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, byte-swapped)")
    raw = name.encode("ascii", "replace")[:8 * (CRC - DIM0)]
    rec[_NAME] = np.frombuffer(raw.ljust(8 * (CRC - DIM0), b"\0"), np.int64)


def dtype_name(code: int, rec: Optional[np.ndarray] = None) -> str:
    if code in _PROBLEMS:
        return _PROBLEMS[code]
    if code == BFLOAT16:
        return "bfloat16"
    if rec is not None and code < 0:
        packed = np.ascontiguousarray(rec[_NAME], dtype=np.int64).tobytes().rstrip(b"\0")
        if packed:
            return packed.decode("ascii", "replace")
    if code <= -GPU_UNSUPPORTED:
        code = -(-code - GPU_UNSUPPORTED)
    try:
        return np.dtype(chr(abs(code))).name
    except (TypeError, ValueError):
        return "an unsupported dtype"


def record(seq: int, kind: str, op: str, dtype: np.dtype, shape, root: int = 0,
           problem: int = 0) -> np.ndarray:
    """``problem`` (NOT_AN_ARRAY, ...) marks an input this rank cannot use, so that the others
    learn about it in the metadata exchange instead of waiting for a rank that gave up."""
    rec = np.zeros(RECORD, dtype=np.int64)
    shape = tuple(int(d) for d in shape)
    rec[SEQ] = seq
    rec[KIND] = KINDS.index(kind)
    rec[OP] = OPS.index(op) if op in OPS else -1
    rec[DTYPE] = problem or dtype_code(np.dtype(dtype))
    rec[NBYTES] = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    rec[ROOT] = root
    rec[NDIM] = len(shape)
    rec[DIM0:DIM0 + min(len(shape), MAX_DIMS)] = shape[:MAX_DIMS]
    rec[CRC] = zlib.crc32(repr(shape).encode())
    if not problem and rec[DTYPE] < 0:
        pack_name(rec, dtype)
    return rec


def _shape(rec) -> str:
    ndim = int(rec[NDIM])
    if ndim > MAX_DIMS:
        return f"a {ndim}-d array of {int(rec[NBYTES])} bytes"
    dims = ", ".join(str(int(d)) for d in rec[DIM0:DIM0 + ndim])
    return f"shape ({dims}{',' if ndim == 1 else ''})"


def check(table: np.ndarray, whole_world: bool = True,
          ranks: Optional[Sequence[int]] = None) -> Optional[str]:
    """The first inconsistency in a (world, RECORD) table, as a sentence; None if all agree.

    Deterministic in the table alone, so every rank that holds the table says the same thing.
    ``whole_world=False`` checks a subset of the ranks (one node's), where roots are not known;
    ``ranks`` then names the rows (row i is rank i without it).
    The common case, every row equal to the first, is one bytes (or numpy) comparison and a
    dict lookup of that record's verdict: no Python loop over the ranks.
    """
    n = len(table)
    raw = table.tobytes()
    row = raw[:RECORD * 8]
    if (raw == row * n) if n <= 64 else bool((table == table[0]).all()):
        key = (row[8:], n if whole_world else None,   # the verdict does not need SEQ
               None if ranks is None else ranks[0])
        verdict = _VERDICTS.get(key, _UNKNOWN)
        if verdict is _UNKNOWN:
            if len(_VERDICTS) > 1024:
                _VERDICTS.clear()
            ref = table[0]
            verdict = _VERDICTS[key] = (
                _first_mismatch(table[:1], False, ranks) if ref[DTYPE] <= 0 or ref[OP] < 0
                else _valid_call(ref, key[1]))
        return verdict
    kinds = table[:, KIND]
    if (kinds == CHECK).any():
        return f"{DIVERGED} (collective #{int(table[:, SEQ].min())} or earlier)"
    return _first_mismatch(table, whole_world, ranks)


_VERDICTS = {}          # (a record without its SEQ, world) -> check()'s answer for all-equal rows
_UNKNOWN = object()


def _valid_call(ref, world: Optional[int]) -> Optional[str]:
    """What every rank agreeing on ``ref`` can still get wrong."""
    what = KINDS[int(ref[KIND])]
    if ref[OP] == 1 and int(ref[DTYPE]) != BFLOAT16 and chr(int(ref[DTYPE])) not in "efd":
        return (f"{what}: op 'mean' needs a floating dtype, got {dtype_name(int(ref[DTYPE]))} "
                "(use op='sum' and divide yourself)")
    if world is not None and not 0 <= ref[ROOT] < world:
        return f"{what}: root {int(ref[ROOT])} is not a rank (world size {world})"
    return None


def _first_mismatch(table: np.ndarray, whole_world: bool,
                    ranks: Optional[Sequence[int]] = None) -> Optional[str]:
    for r, rec in enumerate(table):
        who = r if ranks is None else ranks[r]
        if rec[DTYPE] <= 0:
            if int(rec[DTYPE]) in _PROBLEMS:
                return f"rank {who} passed {dtype_name(int(rec[DTYPE]))}"
            if rec[DTYPE] <= -GPU_UNSUPPORTED:
                return (f"rank {who} passed a CuPy {dtype_name(int(rec[DTYPE]), rec)} array, "
                        f"which NCCL collectives do not support (on GPUs use {GPU_DTYPES})")
            return (f"rank {who} passed {dtype_name(int(rec[DTYPE]), rec)}, which collectives "
                    f"do not support (use {CPU_DTYPES})")
        if rec[OP] < 0:
            return f"rank {who} passed an unknown op (use one of {', '.join(OPS)})"
    ref = table[0]
    what = KINDS[int(ref[KIND])]
    first = 0 if ranks is None else ranks[0]
    for r, rec in enumerate(table[1:], start=1):
        who = r if ranks is None else ranks[r]
        if rec[SEQ] == ref[SEQ] and rec[KIND] != ref[KIND]:
            return (f"collective #{int(ref[SEQ])}: rank {first} called {what} but rank {who} "
                    f"called {KINDS[int(rec[KIND])]}; every rank must make the same collective "
                    "calls in the same order")
        if rec[SEQ] != ref[SEQ]:
            return (f"rank {first} is in collective #{int(ref[SEQ])} ({what}) but rank {who} is "
                    f"in #{int(rec[SEQ])} ({KINDS[int(rec[KIND])]}); every rank must make the "
                    "same collective calls in the same order")
        if rec[OP] != ref[OP]:
            return (f"{what}: rank {first} asked for op '{OPS[int(ref[OP])]}' but rank {who} for "
                    f"'{OPS[int(rec[OP])]}'")
        if rec[ROOT] != ref[ROOT]:
            return (f"{what}: rank {first} names root {int(ref[ROOT])} but rank {who} names "
                    f"{int(rec[ROOT])}")
        if rec[DTYPE] != ref[DTYPE]:
            return (f"{what}: dtype mismatch: rank {first} passed {dtype_name(int(ref[DTYPE]))}, "
                    f"rank {who} passed {dtype_name(int(rec[DTYPE]))}")
        if rec[CRC] != ref[CRC] or rec[NBYTES] != ref[NBYTES] or rec[NDIM] != ref[NDIM]:
            return (f"{what}: shape mismatch: rank {first} passed {_shape(ref)}, rank {who} "
                    f"{_shape(rec)}")
    return _valid_call(ref, len(table) if whole_world else None)


def reducer(op: str):
    """The numpy ufunc that combines two partial results (mean reduces as a sum)."""
    # an unknown op is reported by check(); this must not fail before the ranks have agreed
    return {"max": np.maximum, "min": np.minimum}.get(op, np.add)
