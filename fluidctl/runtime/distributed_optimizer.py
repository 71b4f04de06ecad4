"""``DistributedOptimizer``: the same training loop in collective and parameter-server mode.

Collective mode (the seeds' NCCL2 mode): at construction every rank checks that all ranks hold
the same parameters (names, shapes, dtypes) and takes rank 0's initial values (parameters are
initialised on trainer 0 and distributed). Each ``step(grads)`` averages the gradients across
ranks and applies the optimizer, in place, keeping each parameter's dtype.

- ``reduce_strategy="AllReduce"`` (default): gradients are allreduced, every rank updates every
  parameter.
- ``reduce_strategy="Reduce"``: each parameter has one owner rank (largest first onto the least
  loaded rank); gradients are reduced to the owner, only the owner keeps optimizer state and
  updates, then broadcasts the new values.

Gradients are fused: parameters of one dtype (and, for Reduce, one owner) are packed into
buckets of up to ``fuse_grad_size_mb``, so many small gradients cost few collective calls;
on GPUs a step's bucket collectives are one NCCL group with one completion event.

Parameter-server mode (``ctx.mode == "pserver"``) hands everything to
``fluidctl.runtime.pserver.client.PServerOptimizer`` with the same ``step(grads)`` API; the
strategy's ``split_method``, ``slice_var_up``, ``min_block_size`` and ``sync`` are for it.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import numpy as np

from fluidctl.runtime import optim as _optim
from fluidctl.runtime.collective.meta import CollectiveError

REDUCE_STRATEGIES = ("AllReduce", "Reduce")


@dataclass
class DistributeStrategy:
    """How gradients travel. Collective mode reads the first block, pserver mode the second."""
    reduce_strategy: str = "AllReduce"     # "AllReduce" | "Reduce"
    fuse_all_reduce_ops: bool = True
    fuse_grad_size_mb: float = 32.0
    # parameter-server mode (read by fluidctl.runtime.pserver.client.PServerOptimizer)
    split_method: str = "RoundRobin"       # "RoundRobin" | "HashName"
    slice_var_up: bool = True
    min_block_size: int = 8192
    sync: Optional[bool] = None            # None: the job's mode (FLUIDCTL_SYNC_MODE)

    def __post_init__(self):
        by_lower = {s.lower(): s for s in REDUCE_STRATEGIES}
        if str(self.reduce_strategy).lower() not in by_lower:
            raise ValueError(f"reduce_strategy must be one of {', '.join(REDUCE_STRATEGIES)}, "
                             f"got {self.reduce_strategy!r}")
        self.reduce_strategy = by_lower[str(self.reduce_strategy).lower()]
        if self.fuse_grad_size_mb <= 0:
            raise ValueError(f"fuse_grad_size_mb must be positive, got {self.fuse_grad_size_mb}")


@dataclass
class _Bucket:
    names: List[str]
    owner: int                 # Reduce: the rank that updates these; AllReduce: -1
    grads: object              # flat buffer for the fused gradients
    offsets: List[int]


class DistributedOptimizer:
    """``params``: dict name -> array (numpy, or cupy on GPU), updated in place by ``step``."""

    def __init__(self, params: Mapping[str, object], optimizer: Optional[_optim.Optimizer] = None,
                 strategy: Optional[DistributeStrategy] = None, ctx=None):
        if ctx is None:
            import fluidctl.runtime as rt
            ctx = rt.init()
        self.ctx = ctx
        self.optimizer = optimizer if optimizer is not None else _optim.SGD(lr=0.01)
        self.strategy = strategy if strategy is not None else DistributeStrategy()
        self._steps = 0
        self._pserver = None
        if ctx.mode == "pserver":
            from fluidctl.runtime.pserver.client import PServerOptimizer
            self._pserver = PServerOptimizer(params, optimizer=self.optimizer,
                                             strategy=self.strategy, ctx=ctx)
            self.params = self._pserver.params
            return
        self.params: Dict[str, object] = {}
        for name, p in params.items():
            if getattr(p, "dtype", None) is None or not (p.dtype.kind == "f"
                                                         or p.dtype.name == "bfloat16"):
                raise TypeError(f"parameter {name!r} must be a floating-point array, "
                                f"got {type(p).__name__} {getattr(p, 'dtype', '')}")
            # CuPy's Flags has only c_contiguous, f_contiguous and owndata (device memory is
            # always writeable); numpy's also says whether the array may be written
            if not (p.flags.c_contiguous and getattr(p.flags, "writeable", True)):
                raise TypeError(f"parameter {name!r} must be a writeable C-contiguous array "
                                "(it is updated in place)")
            self.params[name] = p
        self.world = ctx.world_size
        self.owner = self._owners() if self.strategy.reduce_strategy == "Reduce" else {}
        self._buckets = self._plan()
        self._check_same_everywhere()
        self._broadcast_params({n: 0 for n in self.params})

    # --- set-up ------------------------------------------------------------------------
    def _owners(self) -> Dict[str, int]:
        """Largest parameter first onto the least-loaded rank: the same answer on every rank."""
        load = [0] * self.world
        owner = {}
        for name in sorted(self.params, key=lambda n: (-self.params[n].nbytes, n)):
            rank = min(range(self.world), key=lambda r: (load[r], r))
            owner[name] = rank
            load[rank] += self.params[name].nbytes
        return owner

    def _plan(self) -> List[_Bucket]:
        limit = int(self.strategy.fuse_grad_size_mb * (1 << 20))
        groups: Dict[tuple, List[List[str]]] = {}
        for name, p in self.params.items():
            key = (p.dtype, self.owner.get(name, -1))   # the dtype: bfloat16's str is '<V2'
            runs = groups.setdefault(key, [[]])
            size = sum(self.params[n].nbytes for n in runs[-1])
            if runs[-1] and (not self.strategy.fuse_all_reduce_ops or size + p.nbytes > limit):
                runs.append([])
            runs[-1].append(name)
        buckets = []
        for (dtype, owner), runs in groups.items():
            for names in runs:
                offsets = [0]
                for n in names:
                    offsets.append(offsets[-1] + self.params[n].size)
                xp = self.ctx.xp if type(self.params[names[0]]).__module__.startswith("cupy") \
                    else np
                buckets.append(_Bucket(names, owner, xp.empty(offsets[-1], dtype=dtype),
                                       offsets))
        return buckets

    def _check_same_everywhere(self) -> None:
        spec = repr([(n, tuple(p.shape), p.dtype.name, p.dtype.str)
                     for n, p in self.params.items()])
        digest = np.array([zlib.crc32(spec.encode())], dtype=np.int64)
        seen = np.asarray(self.ctx.allgather(digest)).reshape(-1)
        others = [r for r in range(self.world) if seen[r] != seen[0]]
        if others:
            raise CollectiveError(
                f"DistributedOptimizer: rank(s) {', '.join(map(str, others))} hold different "
                "parameters (names, shapes or dtypes) than rank 0; every rank must build the "
                "same model")

    def _broadcast_params(self, owner: Mapping[str, int]) -> None:
        """Every bucket's parameters take their owner's values (rank 0 at construction)."""
        if self.world == 1:
            return
        rank = self.ctx.rank
        for b in self._buckets:                                  # grads reused as scratch
            if rank == owner[b.names[0]]:
                for name, view in zip(b.names, self._views(b)):
                    view[...] = self.params[name].reshape(-1)
        with self.ctx.coalesced():                               # GPU: one NCCL group
            for b in self._buckets:
                self.ctx.broadcast(b.grads, root=owner[b.names[0]])
        for b in self._buckets:
            if rank != owner[b.names[0]]:
                for name, view in zip(b.names, self._views(b)):
                    self.params[name].reshape(-1)[...] = view

    def _views(self, b: _Bucket):
        return [b.grads[lo:hi] for lo, hi in zip(b.offsets, b.offsets[1:])]

    # --- training ----------------------------------------------------------------------
    def step(self, grads: Mapping[str, object]) -> int:
        """Average ``grads`` across ranks and update the parameters in place; returns the step
        number."""
        if self._pserver is not None:
            return self._pserver.step(grads)
        missing = [n for n in self.params if n not in grads]
        if missing:
            raise KeyError(f"step(): no gradient for {', '.join(missing)}")
        for b in self._buckets:
            for name, view in zip(b.names, self._views(b)):
                g = grads[name]
                if tuple(g.shape) != tuple(self.params[name].shape):
                    raise ValueError(f"gradient {name!r} has shape {tuple(g.shape)}, the "
                                     f"parameter {tuple(self.params[name].shape)}")
                view[...] = g.reshape(-1)
        if self.world > 1:
            # every bucket's collective, then every update: on GPU one NCCL group and one
            # completion event per step (ctx.coalesced); op="mean": bfloat16 is divided
            # before its one rounding on CPU transports
            with self.ctx.coalesced():
                for b in self._buckets:
                    if b.owner < 0:
                        self.ctx.allreduce(b.grads, op="mean")
                    else:
                        self.ctx.reduce(b.grads, root=b.owner, op="mean")
        for b in self._buckets:
            if b.owner < 0 or b.owner == self.ctx.rank:
                for name, view in zip(b.names, self._views(b)):
                    self.optimizer.apply(name, self.params[name],
                                         view.reshape(self.params[name].shape))
        if self.owner:
            self._broadcast_params(self.owner)
        self._steps += 1
        return self._steps

    @property
    def step_count(self) -> int:
        """Steps taken (in pserver mode: the pservers' global step)."""
        return self._pserver.step_count if self._pserver is not None else self._steps

    def close(self) -> None:
        if self._pserver is not None:
            self._pserver.close()

    def __getattr__(self, name):
        # pserver-only extras (sparse_table, pull, stats, ...) pass through
        pserver = self.__dict__.get("_pserver")
        if pserver is not None:
            return getattr(pserver, name)
        raise AttributeError(name)
