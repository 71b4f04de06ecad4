"""A pserver's share of a distributed embedding (the seeds' ``is_distributed`` + ``is_sparse``).

Rows are keyed by any int64 id and created on first touch, up to the declared ``dict_size``. A
new row's initial values depend only on (table seed, id, column), through a counter-based hash,
so they are the same whichever pserver creates the row, in whatever order, after any restart.
Optimizer state (momentum, Adam moments) is kept per row beside the rows.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

import fluidctl.runtime.optim as optim

INITS = ("uniform", "zeros")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def initial_rows(ids: np.ndarray, dim: int, dtype, init: str, scale: float, seed: int
                 ) -> np.ndarray:
    """Deterministic first values of rows ``ids``: uniform in [-scale, scale) or zeros."""
    if init == "zeros":
        return np.zeros((len(ids), dim), dtype=dtype)
    with np.errstate(over="ignore"):
        key = (ids.astype(np.int64).view(np.uint64)[:, None] * np.uint64(dim)
               + np.arange(dim, dtype=np.uint64)[None, :]
               + np.uint64(seed) * np.uint64(0x632BE59BD9B4E019))
    bits = _splitmix64(key) >> np.uint64(11)                   # 53 random bits
    unit = bits.astype(np.float64) / float(1 << 53)
    return ((unit * 2.0 - 1.0) * scale).astype(dtype)


class SparseTable:
    """Rows of one embedding held by this pserver."""

    def __init__(self, name: str, dim: int, dict_size: int, dtype: str = "<f4",
                 init: str = "uniform", scale: float = 0.01, seed: int = 0):
        if dim < 1 or dict_size < 1:
            raise ValueError(f"sparse table {name!r}: dim and dict_size must be positive")
        if init not in INITS:
            raise ValueError(f"sparse table {name!r}: init must be one of {', '.join(INITS)}")
        self.name, self.dim, self.dict_size = name, int(dim), int(dict_size)
        self.dtype = np.dtype(dtype)
        self.init, self.scale, self.seed = init, float(scale), int(seed)
        self.index: Dict[int, int] = {}                  # id -> row number
        self.ids = np.zeros(0, dtype=np.int64)           # row number -> id
        self.rows = np.zeros((0, self.dim), dtype=self.dtype)
        self.slots: Dict[str, np.ndarray] = {}           # optimizer state, per row or scalar

    def meta(self) -> dict:
        return {"name": self.name, "dim": self.dim, "dict_size": self.dict_size,
                "dtype": self.dtype.str, "init": self.init, "scale": self.scale,
                "seed": self.seed}

    @property
    def size(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return self.size * self.dim * self.dtype.itemsize

    def _grow(self, need: int) -> None:
        cap = len(self.rows)
        if need <= cap:
            return
        cap = max(need, 2 * cap, 64)

        def grown(arr):
            out = np.zeros((cap,) + arr.shape[1:], dtype=arr.dtype)
            out[:len(arr)] = arr
            return out
        self.rows = grown(self.rows)
        self.ids = grown(self.ids)
        for slot, arr in self.slots.items():
            if arr.ndim == 2:
                self.slots[slot] = grown(arr)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of ``ids``, creating missing rows (ValueError past dict_size)."""
        index = self.index
        rows = np.empty(len(ids), dtype=np.int64)
        missing = []
        for i, key in enumerate(ids.tolist()):
            row = index.get(key)
            if row is None:
                missing.append(i)
            else:
                rows[i] = row
        if missing:
            new_ids = np.unique(ids[missing])
            start = self.size
            if start + len(new_ids) > self.dict_size:
                raise ValueError(f"sparse table {self.name!r} is full ({self.dict_size} rows "
                                 "on this pserver; declare a larger dict_size)")
            self._grow(start + len(new_ids))
            self.rows[start:start + len(new_ids)] = initial_rows(
                new_ids, self.dim, self.dtype, self.init, self.scale, self.seed)
            self.ids[start:start + len(new_ids)] = new_ids
            for j, key in enumerate(new_ids.tolist()):
                index[key] = start + j
            for i in missing:
                rows[i] = index[int(ids[i])]
        return rows

    def apply(self, opt: optim.Optimizer, rows: np.ndarray, grad: np.ndarray) -> None:
        """Run the optimizer on the touched rows only (rows are unique)."""
        key = f"sparse/{self.name}"
        opt.state[key] = {slot: (arr[rows] if arr.ndim == 2 else arr)
                          for slot, arr in self.slots.items()}
        param = self.rows[rows]
        opt.apply(key, param, grad)
        self.rows[rows] = param
        for slot, arr in opt.state.pop(key).items():
            if arr.ndim == 2:
                full = self.slots.get(slot)
                if full is None:
                    full = self.slots[slot] = np.zeros((len(self.rows), self.dim), arr.dtype)
                full[rows] = arr
            else:
                self.slots[slot] = arr

    # --- checkpoints --------------------------------------------------------------------
    def arrays(self) -> Dict[str, np.ndarray]:
        n = self.size
        out = {"ids": self.ids[:n], "rows": self.rows[:n]}
        for slot, arr in self.slots.items():
            out[f"slot/{slot}"] = arr[:n] if arr.ndim == 2 else arr
        return out

    @classmethod
    def restore(cls, meta: dict, arrays: Dict[str, np.ndarray]) -> "SparseTable":
        table = cls(**meta)
        ids = arrays["ids"]
        table.ids, table.rows = ids.copy(), arrays["rows"].copy()
        table.index = {key: i for i, key in enumerate(ids.tolist())}
        for name, arr in arrays.items():
            if name.startswith("slot/"):
                table.slots[name[5:]] = arr.copy()
        return table


def check_meta(existing: Optional[SparseTable], meta: dict) -> None:
    if existing is None:
        return
    mine = existing.meta()
    diff = [k for k in ("dim", "dict_size", "dtype") if mine[k] != meta.get(k)]
    if diff:
        raise ValueError(f"sparse table {existing.name!r} already exists with different "
                         f"{', '.join(diff)}")
