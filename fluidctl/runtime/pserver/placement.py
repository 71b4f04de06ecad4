"""Which parameter server holds which piece of which tensor.

The seeds' ``DistributeTranspiler`` options, computed the same way on every trainer (pure
functions of names, shapes and the pserver list, so trainers agree without talking):

- ``slice_var_up`` (default on): a tensor of more than ``min_block_size`` (8192) elements is cut
  into ``min(pservers, numel // min_block_size)`` blocks of equal size, the block size rounded up
  to whole rows for tensors of 2 or more dimensions (Paddle's ``slice_variable``).
- ``split_method``: ``RoundRobin`` (default; blocks dealt to pservers in order), ``HashName``
  (crc32 of the block name: stable across processes, unlike Python's ``hash()``), or a callable
  ``f(block_names, endpoints) -> [endpoint, ...]`` (one endpoint per block, like Paddle's
  ``PSDispatcher.dispatch``).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable, List, Mapping, Sequence, Tuple, Union

MIN_BLOCK_SIZE = 8192

SplitMethod = Union[str, Callable[[List[str], List[str]], List[str]]]


@dataclass(frozen=True)
class Block:
    """A contiguous range of a tensor's flattened elements, held by one pserver."""
    name: str                 # the tensor's name
    index: int                # block number within the tensor
    count: int                # how many blocks the tensor was cut into
    offset: int               # first element, in the flattened tensor
    numel: int
    shape: Tuple[int, ...]    # the block's own shape (whole rows of the tensor)

    @property
    def key(self) -> str:
        """The name the pserver stores it under (Paddle's ``name.blockN``; whole tensors keep
        their name)."""
        return self.name if self.count == 1 else f"{self.name}.block{self.index}"


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def slice_tensor(name: str, shape: Sequence[int], slice_count: int,
                 min_block_size: int = MIN_BLOCK_SIZE) -> List[Block]:
    """Cut one tensor into blocks (Paddle's ``slice_variable``)."""
    shape = tuple(int(d) for d in shape)
    numel = _numel(shape)
    split = max(1, min(slice_count, numel // min_block_size))
    block_size = max(1, math.ceil(numel / split))
    row = _numel(shape[1:]) if len(shape) >= 2 else 1
    if row and block_size % row:
        block_size += row - block_size % row          # whole rows only
    count = max(1, math.ceil(numel / block_size)) if numel else 1
    blocks = []
    for i in range(count):
        offset = i * block_size
        size = min(block_size, numel - offset)
        if len(shape) >= 2:
            block_shape = (size // row,) + shape[1:] if row else shape
        elif count == 1:
            block_shape = shape
        else:
            block_shape = (size,)
        blocks.append(Block(name, i, count, offset, size, block_shape))
    return blocks


def hash_name(key: str, n: int) -> int:
    return zlib.crc32(key.encode()) % n


def block_table(shapes: Mapping[str, Sequence[int]], endpoints: Sequence[str],
                split_method: SplitMethod = "RoundRobin", slice_var_up: bool = True,
                min_block_size: int = MIN_BLOCK_SIZE) -> List[Tuple[Block, int]]:
    """Every block of every tensor (in ``shapes``' order) with the index of its pserver."""
    n = len(endpoints)
    if n < 1:
        raise ValueError("no parameter servers to place tensors on")
    if min_block_size < 1:
        raise ValueError(f"min_block_size must be positive, got {min_block_size}")
    blocks: List[Block] = []
    for name, shape in shapes.items():
        if slice_var_up:
            blocks.extend(slice_tensor(name, shape, n, min_block_size))
        else:
            blocks.extend(slice_tensor(name, shape, 1, 1))
    return list(zip(blocks, dispatch([b.key for b in blocks], endpoints, split_method)))


def dispatch(keys: List[str], endpoints: Sequence[str], split_method: SplitMethod) -> List[int]:
    """Pserver index for each block key."""
    n = len(endpoints)
    if callable(split_method):
        chosen = list(split_method(list(keys), list(endpoints)))
        if len(chosen) != len(keys):
            raise ValueError(f"split_method returned {len(chosen)} endpoints for "
                             f"{len(keys)} blocks")
        try:
            return [ep if isinstance(ep, int) and 0 <= ep < n else list(endpoints).index(ep)
                    for ep in chosen]
        except ValueError:
            raise ValueError("split_method returned an endpoint that is not a pserver") from None
    method = str(split_method).replace("_", "").lower()
    if method == "roundrobin":
        return [i % n for i in range(len(keys))]
    if method == "hashname":
        return [hash_name(k, n) for k in keys]
    raise ValueError(f"unknown split_method {split_method!r}: use RoundRobin, HashName or a "
                     "callable(block_names, endpoints) -> endpoints")


def fingerprint(table: Sequence[Tuple[Block, int]]) -> int:
    """A checksum of the placement: pservers refuse trainers that disagree on it."""
    text = ";".join(f"{b.key}:{b.offset}:{b.numel}:{s}" for b, s in table)
    return zlib.crc32(text.encode())


def sparse_owner(ids, n: int):
    """Pserver index of each sparse row id (numpy int64 array): id mod pservers, negatives
    wrapped as unsigned so every int64 has exactly one owner."""
    import numpy as np
    return (np.asarray(ids, dtype=np.int64).view(np.uint64) % np.uint64(n)).astype(np.int64)
