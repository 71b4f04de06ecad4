"""The global order of an epoch over canonical shards, and each rank's part of it: pure
arithmetic, no I/O, so a job stopped at one world size resumes at another exactly.

An epoch's order is a permutation of every sample, fixed by (seed, epoch) and the shards' record
counts, never by the world size: the shards in a keyed order, then inside each shard its records
in a keyed order. A permutation of more than 1024 items is a keyed bijection (a Feistel network
with cycle walking), so no large permutation is ever held in memory: position -> (shard, record)
is computed on demand; smaller ones are a uniform shuffle's table.

Rank ``r`` of ``W`` ranks, resuming at global offset ``o``, takes positions ``o + r``,
``o + r + W``, ``o + r + 2W`` ...; a step of batch size ``B`` is the window of ``B * W``
positions after the previous step's, rank ``r`` taking every ``W``-th from its ``r``-th. After
``k`` steps every rank is at offset ``o + k * B * W``: that number (with the epoch) is the whole
state to save. The last step of an epoch holds what is left: short batches, ranks at most one
sample apart, empty on ranks ``r >= left`` when fewer than ``W`` samples are left; with
``drop_last`` the samples past the last full step are skipped for that epoch.
"""
from __future__ import annotations

import bisect
from typing import Iterator, Sequence, Tuple

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15        # 2**64 / the golden ratio: multiplicative hashing


def mix(x: int) -> int:
    """splitmix64's finalizer: a 64-bit integer hash, the same on every platform and version."""
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def key_of(*parts: int) -> int:
    """One 64-bit key from several non-negative integers (seed, epoch, shard ...)."""
    key = 0
    for part in parts:
        key = mix(key ^ mix(part))
    return key


SMALL = 1024        # up to this many items, a table: a Feistel network's orders are uneven


def shuffled(n: int, key: int) -> list:
    """``range(n)`` in a keyed uniform order: Fisher-Yates driven by splitmix64 (64-bit draws,
    so the modulo's bias is below 2**-50)."""
    items, state = list(range(n)), key
    for i in range(n - 1, 0, -1):
        state = (state + _GOLDEN) & _M64
        j = mix(state) % (i + 1)
        items[i], items[j] = items[j], items[i]
    return items


class Permutation:
    """A keyed bijection of ``range(n)``. Up to ``SMALL`` items, a table from
    :func:`shuffled` (uniform). Beyond, no table: a four-round balanced Feistel network over the
    smallest even number of bits that holds ``n`` (each round: the top bits of one half xor a
    round key times the golden-ratio constant, Fibonacci hashing, xored into the other half),
    walked until the value falls inside: the domain is under 4x the range, so under 4 walks and
    about 2 on average. ``perm(i)`` costs a few microseconds and no memory; integer arithmetic
    only, so the same order on every platform and Python version."""

    __slots__ = ("n", "half", "mask", "shift", "keys", "table")

    def __init__(self, n: int, key: int):
        self.n = n
        self.table = shuffled(n, key) if n <= SMALL else None
        if self.table is None:
            half = ((n - 1).bit_length() + 1) // 2
            self.half, self.mask, self.shift = half, (1 << half) - 1, 64 - half
            self.keys = tuple(key_of(key, i) for i in range(4))

    def __call__(self, i: int) -> int:
        if self.table is not None:
            return self.table[i]
        n = self.n
        half, mask, shift = self.half, self.mask, self.shift
        k0, k1, k2, k3 = self.keys
        while True:
            left, right = i >> half, i & mask
            left ^= ((right ^ k0) * _GOLDEN & _M64) >> shift
            right ^= ((left ^ k1) * _GOLDEN & _M64) >> shift
            left ^= ((right ^ k2) * _GOLDEN & _M64) >> shift
            right ^= ((left ^ k3) * _GOLDEN & _M64) >> shift
            i = (left << half) | right
            if i < n:
                return i


class Identity:
    """The unshuffled order: ``perm(i) == i``."""

    __slots__ = ()

    def __call__(self, i: int) -> int:
        return i


class EpochOrder:
    """Position -> (shard, record) for one epoch: shards in a keyed order, records of each shard
    in a keyed order (or both in index order with ``shuffle=False``)."""

    def __init__(self, counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True):
        self.counts = list(counts)
        self.total = sum(self.counts)
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        order = Permutation(len(self.counts), key_of(seed, epoch, 0)) if shuffle else Identity()
        self.shards = [order(j) for j in range(len(self.counts))]
        self.starts = [0]
        for shard in self.shards:
            self.starts.append(self.starts[-1] + self.counts[shard])
        self._records: dict = {}

    def _record_order(self, shard: int):
        perm = self._records.get(shard)
        if perm is None:
            perm = (Permutation(self.counts[shard], key_of(self.seed, self.epoch, shard + 1))
                    if self.shuffle else Identity())
            if len(self._records) > 8:
                self._records.clear()
            self._records[shard] = perm
        return perm

    def sample(self, position: int) -> Tuple[int, int]:
        """The (shard, record) at ``position`` of this epoch's order."""
        if not 0 <= position < self.total:
            raise IndexError(f"position {position} is outside 0..{self.total - 1}")
        j = bisect.bisect_right(self.starts, position) - 1
        shard = self.shards[j]
        return shard, self._record_order(shard)(position - self.starts[j])


    def runs(self, positions: range) -> list:
        """``[(shard, [record, ...]), ...]`` for the positions of one step, in order, grouped
        by shard: what :meth:`sample` gives for each, with one lookup per shard."""
        out, p, stop, step = [], positions.start, positions.stop, positions.step
        while p < stop:
            j = bisect.bisect_right(self.starts, p) - 1
            shard, base, end = self.shards[j], self.starts[j], min(stop, self.starts[j + 1])
            perm = self._record_order(shard)
            out.append((shard, [perm(q - base) for q in range(p, end, step)]))
            p += -(-(end - p) // step) * step
        return out


def steps_left(offset: int, total: int, per_step: int, drop_last: bool) -> int:
    """Steps from ``offset`` to the end of the epoch, ``per_step = batch_size * world``."""
    left = max(0, total - offset)
    return left // per_step if drop_last else -(-left // per_step)


def step_positions(offset: int, rank: int, world: int, batch_size: int,
                   total: int) -> range:
    """Rank ``rank``'s positions in the step that starts at global ``offset``."""
    return range(offset + rank, min(offset + batch_size * world, total), world)


def rank_steps(offset: int, rank: int, world: int, batch_size: int, total: int,
               drop_last: bool) -> Iterator[range]:
    """Every remaining step's positions for one rank, from ``offset`` to the epoch's end."""
    per_step = batch_size * world
    for k in range(steps_left(offset, total, per_step, drop_last)):
        yield step_positions(offset + k * per_step, rank, world, batch_size, total)


def offset_after(offset: int, steps: int, per_step: int, total: int) -> int:
    """The global offset after ``steps`` steps from ``offset``: the same on every rank."""
    return min(total, offset + steps * per_step)

