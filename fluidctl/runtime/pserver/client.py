"""The trainer side of parameter-server mode.

``PServerOptimizer(params, optimizer=SGD(0.1))`` places every parameter's blocks on the pservers
(``placement.block_table``, the same on every trainer), registers them (trainer 0 brings the
initial values, every trainer then starts from the pservers' copy), and ``.step(grads)`` pushes
the gradients and pulls the new values straight into the caller's arrays, talking to all
pservers at once. Sync or async is the pservers' mode; the trainer's code is the same.

``opt.sparse_table(name, dim, dict_size)`` gives a distributed embedding: ``pull(ids)`` fetches
only the rows of a batch, ``push(ids, grads)`` sends sparse gradients; rows live on pserver
``id % pservers``.

A pserver that goes away (killed, restarted from its checkpoint) is reconnected with backoff;
the interrupted request is re-sent after re-registering, so training continues. A pserver that
stays connected but silent (stopped, hung) for FLUIDCTL_TIMEOUT seconds fails the call with a
PServerError naming it: every send and receive has that deadline, and a request that
legitimately waits (a sync round) hears the pserver's ``wait`` frames meanwhile.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from fluidctl import envs
import fluidctl.runtime.optim as optim
import fluidctl.runtime.wire as wire
from fluidctl.runtime.pserver import placement, protocol as P
from fluidctl.runtime.pserver.protocol import PServerError

log = logging.getLogger("fluidctl.pserver.client")

MAX_BACKOFF = 2.0
STARTUP_QUIET = 5.0            # seconds a first connection may be refused without a warning


def _reply(sock, into: Sequence[np.ndarray] = ()) -> dict:
    """Read one reply; its payload lands in ``into``. A refusal raises PServerError.
    ``wait`` frames (the pserver is alive, the request waits for other trainers) are skipped:
    each one restarts the socket's deadline."""
    header, n = wire.recv_header(sock)
    while header.get("op") == P.WAIT and n == 0:
        header, n = wire.recv_header(sock)
    if header.get("op") == P.ERROR:
        wire.drain(sock, n)
        raise PServerError(f"pserver refused the request: {header.get('msg')}")
    if n != sum(a.nbytes for a in into):
        raise wire.WireError(f"reply of {n} bytes, expected {sum(a.nbytes for a in into)}")
    for arr in into:
        if arr.nbytes:
            wire.recv_exact_into(sock, memoryview(arr).cast("B"))
    return header


class _Link:
    """One pserver connection that outlives the pserver: on a broken connection it reconnects
    with exponential backoff, runs ``on_connect`` (re-registration) and retries the request."""

    def __init__(self, endpoint: str, token: Optional[str], reconnect_timeout: float,
                 on_connect: Callable):
        self.endpoint, self.token = endpoint, token
        self.reconnect_timeout = reconnect_timeout
        self.on_connect = on_connect
        self.sock = None
        self.lock = threading.Lock()
        self.reconnects = 0
        self.connected = False          # ever: before that, refusals are a start-up

    def request(self, fn: Callable):
        with self.lock:
            delay, down_since = 0.05, None
            while True:
                calling = False
                try:
                    if self.sock is None:
                        self.sock = wire.connect(self.endpoint, self.token,
                                                 timeout=min(wire.HANDSHAKE_TIMEOUT,
                                                             self.reconnect_timeout),
                                                 io_timeout=self.reconnect_timeout)
                        calling = True       # from here on, a silence is the pserver's
                        self.on_connect(self.sock)
                        first, self.connected = not self.connected, True
                        if down_since is not None and not first:
                            self.reconnects += 1
                            log.warning("reconnected to pserver %s after %.1f s", self.endpoint,
                                        time.monotonic() - down_since)
                    calling = True
                    return fn(self.sock)
                except wire.AuthError as exc:
                    self.close()
                    raise PServerError(f"pserver {self.endpoint}: {exc} (give trainers and "
                                       "pservers the same FLUIDCTL_JOB_TOKEN)") from None
                except PServerError:
                    self.close()
                    raise
                except OSError as exc:        # includes WireError and refused connections
                    self.close()
                    if calling and isinstance(exc, socket.timeout):   # connected, but silent
                        raise PServerError(
                            f"pserver {self.endpoint} did not answer within "
                            f"{self.reconnect_timeout:g} s (stopped or hung? check its "
                            "serverlog; FLUIDCTL_TIMEOUT sets the limit)") from None
                    now = time.monotonic()
                    if down_since is None:
                        down_since, warned = now, False
                    # a pserver still starting up is expected: quiet for STARTUP_QUIET seconds
                    if not warned and (self.connected or now - down_since >= STARTUP_QUIET):
                        warned = True
                        log.warning("pserver %s unreachable (%s); retrying for up to %.0f s",
                                    self.endpoint, exc, self.reconnect_timeout)
                    if now - down_since > self.reconnect_timeout:
                        raise PServerError(f"pserver {self.endpoint} unreachable for "
                                           f"{now - down_since:.0f} s: {exc}") from None
                    time.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _env_of(ctx):
    """The runtime Context (anything with an ``env``), a DistEnv, or the environment."""
    if ctx is None:
        return envs.read()
    env = getattr(ctx, "env", None)
    return env if isinstance(env, envs.DistEnv) else ctx


def _opt_config(optimizer) -> dict:
    if optimizer is None:
        return optim.SGD(0.01).config()
    if isinstance(optimizer, optim.Optimizer):
        return optimizer.config()
    if isinstance(optimizer, Mapping):
        return optim.from_config(optimizer).config()      # validates
    raise TypeError("optimizer must be a fluidctl.runtime.optim optimizer (SGD, Momentum, "
                    f"Adam) or its config() dict, not {type(optimizer).__name__}")


class PServerOptimizer:
    """Train ``params`` (name -> numpy array, updated in place) through parameter servers.

    ``strategy`` may carry ``split_method`` (``"RoundRobin"``, ``"HashName"`` or a callable),
    ``slice_var_up`` (True), ``min_block_size`` (8192) and ``sync``; ``ctx`` is the runtime
    context (default: read the environment contract). Keyword overrides exist for tests and
    for scripts that set things up by hand.
    """

    def __init__(self, params: Mapping[str, np.ndarray], optimizer=None, strategy=None,
                 ctx=None, *, endpoints: Optional[Sequence[str]] = None,
                 trainer_id: Optional[int] = None, token: Optional[str] = None,
                 sync: Optional[bool] = None, reconnect_timeout: Optional[float] = None):
        env = _env_of(ctx)
        self.endpoints = list(endpoints or getattr(env, "pserver_endpoints", []) or [])
        if not self.endpoints:
            raise ValueError("no parameter servers: PADDLE_PSERVERS_IP_PORT_LIST is empty "
                             "(launch with fluidctl train --mode pserver)")
        self.trainer_id = int(trainer_id if trainer_id is not None else getattr(env, "rank", 0))
        self.token = token if token is not None else getattr(env, "token", None)
        strategy_sync = getattr(strategy, "sync", None)
        self.sync = bool(next(s for s in (sync, strategy_sync, getattr(env, "sync", True), True)
                              if s is not None))
        self.reconnect_timeout = float(reconnect_timeout or getattr(env, "timeout", 300.0))
        self.opt_config = _opt_config(optimizer)
        self.params: Dict[str, np.ndarray] = {}
        for name, p in params.items():
            if not isinstance(p, np.ndarray) or not p.flags.c_contiguous or not p.flags.writeable:
                raise TypeError(f"parameter {name!r} must be a writeable C-contiguous numpy "
                                "array (it is updated in place)")
            self.params[name] = p
        self._flat = {name: p.reshape(-1) for name, p in self.params.items()}
        table = placement.block_table(
            {name: p.shape for name, p in self.params.items()}, self.endpoints,
            split_method=getattr(strategy, "split_method", None) or "RoundRobin",
            slice_var_up=getattr(strategy, "slice_var_up", True),
            min_block_size=getattr(strategy, "min_block_size", None)
            or placement.MIN_BLOCK_SIZE)
        self.block_table = table
        self._fingerprint = placement.fingerprint(table)
        self._owned: List[List[placement.Block]] = [[] for _ in self.endpoints]
        for block, server in table:
            self._owned[server].append(block)
        self._tables: Dict[str, SparseTable] = {}
        self._links = [_Link(ep, self.token, self.reconnect_timeout,
                             (lambda sock, i=i: self._register(i, sock)))
                       for i, ep in enumerate(self.endpoints)]
        self._pool = ThreadPoolExecutor(len(self._links), thread_name_prefix="pserver")
        self.step_count = 0
        self.step_count = max(self._on_each(self._pull_request))

    # --- plumbing -----------------------------------------------------------------------
    def _on_each(self, fn: Callable[[int], object], servers: Optional[Sequence[int]] = None
                 ) -> list:
        """Run ``fn(server_index)`` for each server in parallel; re-raise the first error."""
        servers = range(len(self._links)) if servers is None else servers
        futures = [self._pool.submit(fn, i) for i in servers]
        return [f.result() for f in futures]

    def _views(self, flat: Mapping[str, np.ndarray], server: int) -> List[np.ndarray]:
        return [flat[b.name][b.offset:b.offset + b.numel] for b in self._owned[server]]

    def _register(self, server: int, sock, sparse: Optional[list] = None) -> None:
        blocks = self._owned[server] if sparse is None else []
        init = self.trainer_id == 0 and bool(blocks)
        header = {"op": P.REGISTER, "trainer": self.trainer_id, "init": init,
                  "sync": self.sync, "opt": self.opt_config, "fp": self._fingerprint,
                  "dense": [[b.key, self.params[b.name].dtype.str, list(b.shape)]
                            for b in blocks],
                  "sparse": sparse if sparse is not None else
                  [t.meta for t in self._tables.values()]}
        wire.send_frame(sock, header, self._views(self._flat, server) if init else ())
        _reply(sock)

    def _pull_request(self, server: int) -> int:
        if not self._owned[server]:
            return 0
        keys = [b.key for b in self._owned[server]]

        def pull(sock):
            wire.send_frame(sock, {"op": P.PULL, "keys": keys})
            return _reply(sock, self._views(self._flat, server))["step"]
        return self._links[server].request(pull)

    # --- the public API -----------------------------------------------------------------
    def step(self, grads: Mapping[str, np.ndarray]) -> int:
        """Push ``grads`` (name -> array shaped like the parameter) and pull the updated
        parameters into the arrays given at construction. Returns the global step."""
        flat_grads = {}
        for name, param in self.params.items():
            if name not in grads:
                raise KeyError(f"no gradient for parameter {name!r}")
            grad = np.asarray(grads[name])
            if grad.shape != param.shape:
                raise ValueError(f"gradient for {name!r} has shape {grad.shape}, "
                                 f"parameter has {param.shape}")
            flat_grads[name] = np.ascontiguousarray(grad, dtype=param.dtype).reshape(-1)
        step = self.step_count

        def push_pull(server: int) -> int:
            if not self._owned[server] and not (self.sync and self._tables):
                return step             # sync sparse rows are applied at every pserver's barrier
            header = {"op": P.STEP, "trainer": self.trainer_id, "step": step,
                      "keys": [b.key for b in self._owned[server]]}
            grad_views = self._views(flat_grads, server)
            param_views = self._views(self._flat, server)

            def call(sock):
                wire.send_frame(sock, header, grad_views)
                return _reply(sock, param_views)["step"]
            return self._links[server].request(call)
        self.step_count = max(self._on_each(push_pull))
        return self.step_count

    def pull(self) -> None:
        """Fetch the current parameters (async mode: to see other trainers' updates)."""
        self._on_each(self._pull_request)

    def sparse_table(self, name: str, dim: int, dict_size: int, dtype="float32",
                     init: str = "uniform", scale: float = 0.01, seed: int = 0
                     ) -> "SparseTable":
        """A distributed embedding of ``dim`` columns and up to ``dict_size`` int64 ids.
        New rows start uniform in [-scale, scale) (or zeros), the same on every run."""
        meta = {"name": name, "dim": int(dim), "dict_size": int(dict_size),
                "dtype": np.dtype(dtype).str, "init": init, "scale": float(scale),
                "seed": int(seed)}
        table = SparseTable(self, meta)
        self._tables[name] = table

        def register(server: int):
            return self._links[server].request(
                lambda sock: self._register(server, sock, sparse=[meta]))
        self._on_each(register)
        return table

    def stats(self) -> List[dict]:
        """Each pserver's counters (step, pushed, applied, bytes held, ...)."""
        def stats(server: int) -> dict:
            def call(sock):
                wire.send_frame(sock, {"op": P.STATS})
                return _reply(sock)
            return self._links[server].request(call)
        return self._on_each(stats)

    @property
    def reconnects(self) -> int:
        return sum(link.reconnects for link in self._links)

    def close(self) -> None:
        """Tell the pservers this trainer is done (sync rounds stop waiting for it)."""
        def leave(server: int) -> None:
            link = self._links[server]
            try:
                if link.sock is not None:
                    wire.send_frame(link.sock, {"op": P.LEAVE, "trainer": self.trainer_id})
                    _reply(link.sock)
            except (OSError, PServerError):
                pass
            link.close()
        self._on_each(leave)
        self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SparseTable:
    """Trainer handle of a distributed embedding (see ``PServerOptimizer.sparse_table``)."""

    def __init__(self, owner: PServerOptimizer, meta: dict):
        self._owner, self.meta = owner, meta
        self.name, self.dim = meta["name"], meta["dim"]
        self.dtype = np.dtype(meta["dtype"])

    def _split(self, ids: np.ndarray):
        owners = placement.sparse_owner(ids, len(self._owner.endpoints))
        return {s: np.nonzero(owners == s)[0] for s in np.unique(owners).tolist()}

    def pull(self, ids) -> np.ndarray:
        """Rows of ``ids`` (any int64 values, repeats allowed): shape ids.shape + (dim,)."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inverse = np.unique(ids.reshape(-1), return_inverse=True)
        rows = np.empty((len(uniq), self.dim), dtype=self.dtype)
        parts = self._split(uniq)

        def fetch(server: int) -> None:
            sel = parts[server]
            sub_ids = np.ascontiguousarray(uniq[sel])
            out = np.empty((len(sel), self.dim), dtype=self.dtype)

            def call(sock):
                wire.send_frame(sock, {"op": P.SPULL, "table": self.name, "n": len(sub_ids)},
                                [sub_ids])
                _reply(sock, [out])
            self._owner._links[server].request(call)
            rows[sel] = out
        self._owner._on_each(fetch, list(parts))
        return rows[inverse].reshape(ids.shape + (self.dim,))

    def push(self, ids, grads) -> None:
        """Send the gradient rows of ``ids`` (repeats are summed here first)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        grads = np.asarray(grads, dtype=self.dtype).reshape(len(ids), self.dim)
        uniq, inverse = np.unique(ids, return_inverse=True)
        merged = np.zeros((len(uniq), self.dim), dtype=self.dtype)
        np.add.at(merged, inverse, grads)
        parts = self._split(uniq)
        trainer = self._owner.trainer_id

        def send(server: int) -> None:
            sel = parts[server]
            payload = [np.ascontiguousarray(uniq[sel]), np.ascontiguousarray(merged[sel])]

            def call(sock):
                wire.send_frame(sock, {"op": P.SPUSH, "table": self.name, "n": len(sel),
                                       "trainer": trainer}, payload)
                _reply(sock)
            self._owner._links[server].request(call)
        self._owner._on_each(send, list(parts))
