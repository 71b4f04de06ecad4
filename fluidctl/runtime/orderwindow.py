"""The order of :mod:`fluidctl.runtime.order`, computed for many positions at once with numpy:
what :meth:`order.EpochOrder.sample` gives for each position of an array, the same numbers, at a
few nanoseconds a position instead of a few microseconds.

The Feistel rounds are the same integer arithmetic on ``uint64`` arrays (numpy's unsigned
multiplication wraps modulo 2**64, which is the ``& _M64`` of the scalar code); cycle walking
repeats the rounds on the values still outside the range only, and the last few walk on through
the scalar code. Small permutations use the scalar code's table. Every operand is an explicit
``np.uint64``, so numpy 1.x never promotes to float.
"""
from __future__ import annotations

import numpy as np

from fluidctl.runtime import order

_GOLDEN = np.uint64(order._GOLDEN)
_FEW = 32               # values still outside the range when the walk goes on one by one


def permute(perm, items: np.ndarray) -> np.ndarray:
    """``[perm(i) for i in items]`` as a ``uint64`` array, for an :class:`order.Permutation`
    or :class:`order.Identity`."""
    items = np.asarray(items, dtype=np.uint64)
    if isinstance(perm, order.Identity):
        return items
    if perm.table is not None:
        return np.asarray(perm.table, dtype=np.uint64)[items.astype(np.intp)]
    n = np.uint64(perm.n)
    half, mask, shift = np.uint64(perm.half), np.uint64(perm.mask), np.uint64(perm.shift)
    keys = [np.uint64(k) for k in perm.keys]

    def rounds(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        left ^= ((right ^ keys[0]) * _GOLDEN) >> shift
        right ^= ((left ^ keys[1]) * _GOLDEN) >> shift
        left ^= ((right ^ keys[2]) * _GOLDEN) >> shift
        right ^= ((left ^ keys[3]) * _GOLDEN) >> shift
        return (left << half) | right

    with np.errstate(over="ignore"):
        out = rounds(items)
        outside = np.flatnonzero(out >= n)
        while outside.size > _FEW:
            walked = rounds(out[outside])
            out[outside] = walked
            outside = outside[walked >= n]
    for j in outside.tolist():          # the last few walk on in Python: fewer numpy calls
        out[j] = perm(int(out[j]))      # perm(x) walks on from rounds(x), as the loop would
    return out


def samples(epoch_order: order.EpochOrder, positions: np.ndarray) -> tuple:
    """(slots, shards, records) for increasing ``positions`` (int64) of one epoch: ``slots``
    the index of each one's shard in the epoch's shard order (non-decreasing), ``shards`` and
    ``records`` what :meth:`order.EpochOrder.sample` gives."""
    starts = np.asarray(epoch_order.starts, dtype=np.int64)
    slots = np.searchsorted(starts, positions, side="right") - 1
    shard_of_slot = np.asarray(epoch_order.shards, dtype=np.int64)
    records = np.empty(positions.size, dtype=np.int64)
    cuts = np.flatnonzero(np.diff(slots)) + 1
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), positions.size]):
        if lo == hi:
            continue
        slot = int(slots[lo])
        perm = epoch_order._record_order(int(shard_of_slot[slot]))
        local = positions[lo:hi] - starts[slot]
        records[lo:hi] = permute(perm, local).astype(np.int64)
    return slots, shard_of_slot[slots], records
