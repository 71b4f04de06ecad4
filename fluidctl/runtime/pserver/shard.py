"""What one pserver holds and how it changes: dense blocks, sparse tables, the optimizer, and
the synchronous barrier. No sockets here (``server.py`` feeds it), so it can be reasoned about,
and tested, on its own.

Sync mode works in *rounds*: each trainer pushes one gradient per round into its own buffer;
when every trainer still in the job has pushed, the gradients are summed in trainer order,
averaged, applied, and the round's waiters are released with the new values. Sparse gradients
pushed during a round are held until its barrier, then merged (summed per id over every
trainer, averaged like the dense ones) and applied in one optimizer step per table, so
Momentum and Adam see what a single process training on all the trainers' batches would. A
round that does not complete within ``round_timeout`` (FLUIDCTL_TIMEOUT) fails the trainers
waiting in it with an error naming the trainers that did not push. A trainer that
retries a push it already made (same step) is not counted twice. After a restart from a
checkpoint the server may be behind the trainers: the next round simply carries the trainers'
step numbers forward, so they reconnect and continue.

Async mode applies each gradient as it arrives.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

import fluidctl.runtime.optim as optim
from fluidctl.runtime.pserver.protocol import BadRequest
from fluidctl.runtime.pserver.sparse import SparseTable, check_meta


class ShuttingDown(Exception):
    """The server is stopping; waiting requests are dropped (trainers reconnect)."""


class ShardState:
    def __init__(self, trainers: int, sync: bool = True, pserver_id: int = 0,
                 round_timeout: Optional[float] = None):
        if trainers < 1:
            raise ValueError(f"a pserver needs at least one trainer, got {trainers}")
        self.trainers, self.sync, self.pserver_id = int(trainers), bool(sync), pserver_id
        self.cond = threading.Condition()
        self.dense: Dict[str, np.ndarray] = {}
        self.sparse: Dict[str, SparseTable] = {}
        self.opt: Optional[optim.Optimizer] = None
        self.fingerprint: Optional[int] = None
        self.step = 0                 # updates applied (sync: rounds, async: pushes)
        self.rounds = 0               # sync rounds completed by this process
        self.pushed = 0               # dense pushes received
        self.applied = 0              # dense pushes applied (async) or folded into a round
        self.sparse_pushed = 0
        self.arrived: Dict[int, int] = {}          # trainer -> step it pushed this round
        self.last_step: Dict[int, int] = {}        # trainer -> last step folded into a round
        self.left: set = set()
        self.grads: Dict[int, Dict[str, np.ndarray]] = {}   # sync: trainer -> key -> buffer
        self.closing = False
        self.round_timeout = round_timeout
        # sync: sparse gradients of the current round, table -> [(trainer, ids, grads)]
        self.sparse_pending: Dict[str, list] = {}
        self.on_update: Callable[[int], None] = lambda step: None

    # --- what is held -------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return (sum(a.nbytes for a in self.dense.values())
                + sum(t.nbytes for t in self.sparse.values()))

    def stats(self) -> dict:
        with self.cond:
            return {"pserver_id": self.pserver_id, "step": self.step, "sync": self.sync,
                    "trainers": self.trainers, "params": len(self.dense),
                    "sparse_tables": len(self.sparse),
                    "sparse_rows": sum(t.size for t in self.sparse.values()),
                    "bytes": self.nbytes, "pushed": self.pushed, "applied": self.applied,
                    "sparse_pushed": self.sparse_pushed}

    def _check_trainer(self, trainer) -> int:
        if not isinstance(trainer, int) or not 0 <= trainer < self.trainers:
            raise BadRequest(f"trainer id {trainer!r} is outside 0..{self.trainers - 1} "
                             f"(this pserver expects {self.trainers} trainers)")
        return trainer

    # --- registration -------------------------------------------------------------------
    def register(self, trainer: int, *, sync: bool, opt_config: dict, fingerprint: int,
                 dense: Sequence[tuple], init_values: Optional[List[np.ndarray]],
                 sparse: Sequence[dict], timeout: float) -> int:
        """Declare tensors. Trainer 0 brings initial values; the others wait until it has
        (so every trainer starts from the same values), unless a checkpoint already holds them."""
        with self.cond:
            self._check_trainer(trainer)
            if bool(sync) != self.sync:
                raise BadRequest(f"trainer runs {'sync' if sync else 'async'} but this pserver "
                                 f"runs {'sync' if self.sync else 'async'} (start both the "
                                 "same way)")
            if self.opt is None:
                try:
                    self.opt = optim.from_config(opt_config)
                except (ValueError, TypeError) as exc:
                    raise BadRequest(f"bad optimizer config: {exc}") from None
            elif self.opt.config() != opt_config:
                raise BadRequest(f"optimizer {opt_config} differs from the pserver's "
                                 f"{self.opt.config()} (configure every trainer the same)")
            if dense:
                if self.fingerprint is None:
                    self.fingerprint = fingerprint
                elif fingerprint != self.fingerprint:
                    raise BadRequest("trainers disagree on parameter placement (pass the same "
                                     "parameters, in the same order, with the same strategy)")
            self.left.discard(trainer)
            for i, (key, dtype, shape) in enumerate(dense):
                held = self.dense.get(key)
                if held is not None and (held.dtype != dtype or held.shape != shape):
                    raise BadRequest(f"{key!r} is held as {held.dtype}{list(held.shape)}, "
                                     f"trainer {trainer} sent {dtype}{list(shape)}")
                if held is None and init_values is not None:
                    self.dense[key] = init_values[i]
            for meta in sparse:
                check_meta(self.sparse.get(meta["name"]), meta)
                if meta["name"] not in self.sparse:
                    try:
                        self.sparse[meta["name"]] = SparseTable(**meta)
                    except (TypeError, ValueError) as exc:
                        raise BadRequest(str(exc)) from None
            self.cond.notify_all()
            keys = [d[0] for d in dense]
            if not self.cond.wait_for(lambda: self.closing or all(k in self.dense for k in keys),
                                      timeout):
                raise BadRequest("trainer 0 has not registered the parameters "
                                 f"within {timeout:.0f} s (is trainer 0 running?)")
            if self.closing:
                raise ShuttingDown()
            return self.step

    def check_keys(self, keys) -> List[np.ndarray]:
        try:
            return [self.dense[k] for k in keys]
        except (KeyError, TypeError):
            raise BadRequest(f"unknown parameter in {keys!r:.200} (register first)") from None

    # --- dense updates ------------------------------------------------------------------
    def grad_buffers(self, trainer: int, keys: Sequence[str]) -> List[np.ndarray]:
        """Sync mode: where trainer's gradients for ``keys`` are received (one per trainer,
        reused every round, so a step allocates nothing)."""
        self._check_trainer(trainer)
        with self.cond:
            if sorted(keys) != sorted(self.dense):
                raise BadRequest("a sync push must carry every parameter this pserver holds")
            mine = self.grads.setdefault(trainer, {})
            for key in keys:
                if key not in mine:
                    mine[key] = np.empty_like(self.dense[key])
            return [mine[k] for k in keys]

    def push_sync(self, trainer: int, step: int) -> int:
        """Join this round with the gradients already in ``grad_buffers``; return the step
        once the round is applied."""
        with self.cond:
            if step <= self.last_step.get(trainer, -1):
                return self.step                      # a retried push already applied
            self.pushed += 1
            self.arrived[trainer] = step
            joined = self.rounds
            self._finish_round_if_complete()
            done = self.cond.wait_for(lambda: self.rounds > joined or self.closing,
                                      self.round_timeout)
            if not done:
                active = set(range(self.trainers)) - self.left
                missing = sorted(active - set(self.arrived))
                self.arrived.pop(trainer, None)
                raise BadRequest(
                    f"sync round {self.step}: trainer(s) {', '.join(map(str, missing))} did not "
                    f"push within {self.round_timeout:g}s (stopped, hung or crashed? check "
                    "their logs, or raise FLUIDCTL_TIMEOUT)")
            if self.rounds <= joined:
                raise ShuttingDown()
            return self.step

    def _finish_round_if_complete(self) -> None:
        active = set(range(self.trainers)) - self.left
        if not self.arrived or not active <= set(self.arrived):
            return
        order = sorted(self.arrived)
        for key, param in self.dense.items():
            acc = self.grads[order[0]][key]
            for t in order[1:]:
                acc += self.grads[t][key]
            if len(order) > 1:
                acc /= len(order)
            self.opt.apply(key, param, acc)
        self._apply_sparse_round(len(order))
        self.applied += len(order)
        for t in order:
            self.last_step[t] = self.arrived[t]
        self.step = max(self.step + 1, max(self.arrived.values()) + 1)
        self.rounds += 1
        self.arrived.clear()
        self.on_update(self.step)
        self.cond.notify_all()

    def push_async(self, keys: Sequence[str], grads: Sequence[np.ndarray]) -> int:
        with self.cond:
            self.pushed += 1
            for key, grad in zip(keys, grads):
                self.opt.apply(key, self.dense[key], grad)
            self.applied += 1
            self.step += 1
            self.on_update(self.step)
            return self.step

    def values(self, keys: Sequence[str]) -> List[np.ndarray]:
        """Arrays to send for a pull. Sync: the live arrays (nothing changes them until every
        trainer has received them and pushed again). Async: copies taken under the lock."""
        arrays = self.check_keys(keys)
        if self.sync:
            return arrays
        with self.cond:
            return [a.copy() for a in arrays]

    def leave(self, trainer: int) -> None:
        """A trainer finished: later rounds no longer wait for it."""
        with self.cond:
            self.left.add(self._check_trainer(trainer))
            self.arrived.pop(trainer, None)
            self._finish_round_if_complete()
            self.cond.notify_all()

    # --- sparse -------------------------------------------------------------------------
    def table(self, name) -> SparseTable:
        table = self.sparse.get(name) if isinstance(name, str) else None
        if table is None:
            raise BadRequest(f"unknown sparse table {name!r} (register it first)")
        return table

    def sparse_pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        with self.cond:
            table = self.table(name)
            try:
                rows = table.lookup(ids)              # may grow (replace) table.rows
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            return table.rows[rows]

    def sparse_push(self, name: str, ids: np.ndarray, grads: np.ndarray,
                    trainer: Optional[int] = None) -> None:
        """Async: apply a sparse gradient now. Sync: hold it for this round's barrier."""
        with self.cond:
            table = self.table(name)
            try:
                table.lookup(ids)                     # refuse a full table now, not later
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            if self.sync:
                self.sparse_pending.setdefault(name, []).append(
                    (trainer if isinstance(trainer, int) else -1, ids, grads))
            else:
                uniq, merged = _merge_rows(ids, grads)
                table.apply(self.opt, table.lookup(uniq), merged.astype(table.dtype, copy=False))
            self.sparse_pushed += 1

    def _apply_sparse_round(self, trainers: int) -> None:
        """Sync barrier: one optimizer step per sparse table on the merged, averaged gradient
        of every row touched in this round (a table nobody touched still counts the step, so
        Adam's bias correction follows the global step on every pserver)."""
        for name, table in self.sparse.items():
            pushes = sorted(self.sparse_pending.pop(name, []), key=lambda p: p[0])
            if pushes:
                ids = np.concatenate([p[1] for p in pushes])
                grads = np.concatenate([p[2] for p in pushes]).astype(table.dtype, copy=False)
            else:
                ids = np.zeros(0, np.int64)
                grads = np.zeros((0, table.dim), table.dtype)
            uniq, merged = _merge_rows(ids, grads)
            if trainers > 1:
                merged /= merged.dtype.type(trainers)
            table.apply(self.opt, table.lookup(uniq), merged)
        self.sparse_pending.clear()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()


def _merge_rows(ids: np.ndarray, grads: np.ndarray):
    """(unique ids, the sum of each id's gradient rows), in id order."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    merged = np.zeros((len(uniq), grads.shape[1]), dtype=grads.dtype)
    np.add.at(merged, inverse.reshape(-1), grads)
    return uniq, merged
