"""The parameter-server process: sockets in, ``ShardState`` updates, frames out.

One thread per authenticated connection (trainers block in the sync barrier; numpy and socket
calls release the GIL); handshakes run in ``wire.Acceptor`` (one thread, a deadline, caps per
server and per peer address), so an unauthenticated client costs a socket and a few hundred
bytes, for at most the handshake deadline. There is no pserver without a job token.
Everything a peer sends is checked before it costs memory: the handshake proves the job
token, frame lengths are bounded by ``max_frame``, and a request's payload must have exactly the
size its header and the registered shapes imply. A peer that breaks any rule is logged and
dropped; the server keeps serving everyone else. It never unpickles and never runs user code.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import msgpack
import numpy as np

import fluidctl.runtime.wire as wire
from fluidctl.diagnostics import checkpoints as ckptreport
from fluidctl.runtime.pserver import checkpoint, protocol as P
from fluidctl.runtime.pserver.protocol import BadRequest, safe_dtype, safe_shape
from fluidctl.runtime.pserver.shard import ShardState, ShuttingDown

log = logging.getLogger("fluidctl.pserver")

DEFAULT_PORT = 7164
DEFAULT_MAX_FRAME = 1 << 30          # 1 GiB: a pserver's whole shard per request, at most
MAX_CONNECTIONS = 1024               # authenticated connections, one thread each


class NoToken(ValueError):
    """A pserver was configured without a job token."""


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    ports_num: int = 1                 # extra ports serve the same shard (seeds' v2 flags)
    ports_num_for_sparse: int = 0
    trainers: int = 1
    sync: bool = True
    pserver_id: int = 0
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0          # steps between checkpoints; 0: only on SIGTERM
    token: Optional[str] = field(default=None, repr=False)
    max_frame: int = DEFAULT_MAX_FRAME
    register_timeout: float = 300.0
    round_timeout: float = 300.0       # sync: how long a round waits for every trainer
    watch_parent: bool = False         # stop when the process that started us is gone
    exit_when_done: bool = False       # stop (checkpoint, exit 0) once every trainer has left
    write_state: bool = True           # pid file + state record in fluidctl.paths.state_dir()
    log_file: Optional[str] = None     # shown by `fluidctl pserver status`


class _Conn:
    """One authenticated peer."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self.trainer: Optional[int] = None
        self.send_lock = threading.Lock()     # the reply vs the keepalive thread's "wait"
        self.waiting = False                  # in a legitimate wait: keepalives are due
        self.buffers: Dict[str, np.ndarray] = {}        # async gradient buffers, reused

    def grad_buffers(self, keys, like: List[np.ndarray]) -> List[np.ndarray]:
        out = []
        for key, arr in zip(keys, like):
            buf = self.buffers.get(key)
            if buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype:
                buf = self.buffers[key] = np.empty_like(arr)
            out.append(buf)
        return out


def _expect(n: int, expected: int, what: str) -> None:
    if n != expected:
        raise BadRequest(f"{what}: payload of {n} bytes, expected {expected}")


def _recv_into(sock, arrays) -> None:
    for arr in arrays:
        if arr.nbytes:
            wire.recv_exact_into(sock, memoryview(arr).cast("B"))


class PServer:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.shard = ShardState(cfg.trainers, cfg.sync, cfg.pserver_id,
                                round_timeout=cfg.round_timeout)
        self.shard.on_update = self._after_update
        self.stop_event = threading.Event()
        self.listeners: List[socket.socket] = []
        self.port = cfg.port
        self.started = time.time()
        self._conns: Dict[int, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._ckpt_dir: Optional[Path] = None
        self._lock_fd: Optional[int] = None
        self.dropped = 0
        self._drop_log = wire.DropLog(log)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._acceptor: Optional[wire.Acceptor] = None
        self._parent = os.getppid()
        self._state_error: Optional[str] = None
        self.final_checkpoint_failed = False
        self._handlers = {P.REGISTER: self._register, P.STEP: self._step, P.PULL: self._pull,
                          P.SPULL: self._spull, P.SPUSH: self._spush, P.LEAVE: self._leave,
                          P.STATS: self._stats}

    # --- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Load the checkpoint (if any) and bind every port; raises OSError if a port is
        taken, checkpoint.CheckpointError for an unusable checkpoint directory and NoToken
        without a job token."""
        cfg = self.cfg
        if not cfg.token:
            raise NoToken("a pserver never serves without a job token")
        if cfg.checkpoint_dir:
            self._ckpt_dir = checkpoint.shard_dir(cfg.checkpoint_dir, cfg.pserver_id)
            try:            # an OSError here is the directory's, not a port's
                self._lock_fd = checkpoint.lock_dir(self._ckpt_dir)
                manifest = checkpoint.load(self.shard, self._ckpt_dir)
            except OSError as exc:
                raise checkpoint.CheckpointError(
                    f"cannot use the checkpoint directory {self._ckpt_dir}: "
                    f"{exc.strerror or exc}") from None
            if manifest:
                log.info("loaded checkpoint %s: step %d, %d params, %d sparse tables",
                         self._ckpt_dir, self.shard.step, len(self.shard.dense),
                         len(self.shard.sparse))
        count = max(1, cfg.ports_num) + max(0, cfg.ports_num_for_sparse)
        for i in range(count):
            port = cfg.port + i if cfg.port else 0
            sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((cfg.host, port))
                sock.listen(128)
            except OSError:
                sock.close()
                self.close_listeners()
                raise
            self.listeners.append(sock)
        self.port = self.listeners[0].getsockname()[1]

    @property
    def endpoint(self) -> str:
        host = self.cfg.host if self.cfg.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve until ``stop_event`` is set (SIGTERM), then checkpoint and return."""
        self._acceptor = wire.Acceptor(self.listeners, self.cfg.token, self._on_peer,
                                       lambda addr, why: self._drop(f"{addr[0]}:{addr[1]}", why),
                                       name=f"accept-{self.port}").start()
        threading.Thread(target=self._keepalive, name="keepalive", daemon=True).start()
        log.info("pserver %d serving %s (%s, %d trainers, max frame %d MiB)",
                 self.cfg.pserver_id, self.endpoint, "sync" if self.cfg.sync else "async",
                 self.cfg.trainers, self.cfg.max_frame >> 20)
        try:
            while not self.stop_event.wait(1.0):
                self.write_state()
                if self.cfg.watch_parent and os.getppid() != self._parent:
                    log.warning("the launcher (pid %d) is gone; pserver %d stops",
                                self._parent, self.cfg.pserver_id)
                    break
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self.close_listeners()
        with self.shard.cond:
            if self._ckpt_dir is not None:
                self.final_checkpoint_failed = not self._save(final=True)
            self.shard.close()
        with self._conns_lock:
            for conn in self._conns.values():
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._drop_log.close()
        self.remove_state()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("pserver %d stopped at step %d", self.cfg.pserver_id, self.shard.step)

    def close_listeners(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        for sock in self.listeners:
            sock.close()
        self.listeners = []

    # --- keepalives: a waiting request is not a silent pserver ------------------------------
    def _keepalive(self) -> None:
        """Every KEEPALIVE seconds, a ``wait`` frame to each peer whose request waits for
        other trainers (or trainer 0's registration), so its deadline is not spent on them."""
        frame = wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, len(_WAIT_HEAD), 0) + _WAIT_HEAD
        while not self.stop_event.wait(P.KEEPALIVE):
            with self._conns_lock:
                conns = [c for c in self._conns.values() if c.waiting]
            for conn in conns:
                with conn.send_lock:
                    if not conn.waiting:
                        continue
                    try:                  # never block here: a peer that does not read
                        sent = conn.sock.send(frame, socket.MSG_DONTWAIT)
                    except OSError:       # our frames for long is gone; so is a half frame
                        sent = -1
                    if sent != len(frame):
                        try:
                            conn.sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

    def _waiting(self, conn: _Conn, wait, *args, **kwargs):
        """Run ``wait(...)`` (a call that may block on other trainers) with keepalives on."""
        conn.waiting = True
        try:
            return wait(*args, **kwargs)
        finally:
            with conn.send_lock:
                conn.waiting = False

    # --- checkpoints --------------------------------------------------------------------
    def _after_update(self, step: int) -> None:
        every = self.cfg.checkpoint_every
        if self._ckpt_dir is not None and every > 0 and step % every == 0:
            self._save()

    def _save(self, final: bool = False) -> bool:
        try:
            checkpoint.save(self.shard, self._ckpt_dir)
            log.info("checkpoint at step %d in %s", self.shard.step, self._ckpt_dir)
            return True
        except OSError as exc:
            # the launcher reads this line back (fluidctl/diagnostics/checkpoints.py): a warning on its
            # console, and a failed job when the final checkpoint is the one that failed
            log.error(ckptreport.failed_line(self.shard.step, str(self._ckpt_dir), str(exc),
                                             final=final))
            return False

    # --- state record (read by `fluidctl pserver status`) --------------------------------
    def state(self) -> dict:
        stats = self.shard.stats()
        with self._conns_lock:
            trainers = sorted({c.trainer for c in self._conns.values() if c.trainer is not None})
            connections = len(self._conns)
        return {"endpoint": self.endpoint, "host": self.cfg.host, "port": self.port,
                "pid": os.getpid(), "launcher_pid": self._parent if self.cfg.watch_parent
                else None, "started": self.started, "updated": time.time(),
                "checkpoint_dir": self.cfg.checkpoint_dir, "log": self.cfg.log_file,
                "trainers_connected": trainers, "connections": connections,
                "dropped_connections": self.dropped, **stats}

    def write_state(self, strict: bool = False) -> None:
        """Refresh the state record. A failure (full or read-only state directory) is logged
        once and training goes on; ``strict`` (at start-up) raises it as OSError instead."""
        if not self.cfg.write_state:
            return
        from fluidctl import paths
        try:
            state_file = paths.pserver_state_file(self.port)
            state_file.parent.mkdir(parents=True, exist_ok=True)
            paths.write_atomic(state_file, json.dumps(self.state(), indent=1))
            pid_file = paths.pserver_pid_file(self.port)
            if not pid_file.exists():
                paths.write_atomic(pid_file, f"{os.getpid()}\n")
        except OSError as exc:
            if strict:
                raise
            if self._state_error is None:
                log.warning("cannot write the state record in %s (%s); `fluidctl pserver "
                            "status` will not show this pserver until it can; serving on",
                            paths.state_dir(), exc.strerror or exc)
            self._state_error = str(exc)
            return
        if self._state_error is not None:
            log.info("state record written again")
            self._state_error = None

    def remove_state(self) -> None:
        """At the end: the state record, our pid file and, when ``fluidctl pserver start``
        generated our token (the state dir's pserver-PORT.token holding exactly our token),
        that token: a secret for a server that no longer exists. A pserver ended by a plain
        ``kill`` (SIGTERM) otherwise left it behind, with no record left for `stop` to find."""
        if not self.cfg.write_state:
            return
        from fluidctl import paths
        for path in (paths.pserver_state_file(self.port), paths.pserver_pid_file(self.port)):
            try:
                if path.name.endswith(".pid") and path.read_text().strip() != str(os.getpid()):
                    continue
                path.unlink()
            except OSError:
                pass
        token = paths.pserver_token_file(self.port)
        try:
            if self.cfg.token and token.read_text().strip() == self.cfg.token:
                token.unlink()
        except OSError:
            pass

    # --- connections --------------------------------------------------------------------
    def _on_peer(self, sock: socket.socket, addr) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        if self.stop_event.is_set():
            sock.close()
            return
        if not self._slots.acquire(blocking=False):
            self._drop(peer, f"more than {MAX_CONNECTIONS} connections open")
            sock.close()
            return
        threading.Thread(target=self._serve_counted, args=(sock, peer), daemon=True).start()

    def _serve_counted(self, sock: socket.socket, peer: str) -> None:
        try:
            self._serve(sock, peer)
        finally:
            self._slots.release()

    def _drop(self, peer: str, why) -> None:
        self.dropped += 1
        self._drop_log(peer, why)         # rate-limited: a flood must not fill the disk

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            self._drop(peer, exc)
            sock.close()
            return
        conn = _Conn(sock, peer)
        with self._conns_lock:
            self._conns[id(conn)] = conn
        try:
            while True:
                header, n = wire.recv_header(sock, self.cfg.max_frame)
                handler = self._handlers.get(header.get("op"))
                if handler is None:
                    raise wire.WireError(f"unknown request {header.get('op')!r:.40}")
                try:
                    handler(conn, header, n)
                except (BadRequest, KeyError, TypeError, ValueError, AttributeError) as exc:
                    msg = str(exc) if isinstance(exc, BadRequest) else (
                        f"malformed {header.get('op')} request ({type(exc).__name__}: {exc})")
                    self._drop(peer, msg)
                    _try_send(sock, {"op": P.ERROR, "msg": msg})
                    return
        except wire.PeerClosed:
            if conn.trainer is not None:    # not a probe, not a trainer that said it left
                log.info("%s disconnected (trainer %s, without leaving)", peer, conn.trainer)
        except ShuttingDown:
            pass
        except wire.WireError as exc:
            self._drop(peer, exc)
        except OSError as exc:
            log.info("%s: connection lost: %s", peer, exc)
        except Exception:                      # a bug here must not take the server down
            log.exception("internal error serving %s; connection dropped", peer)
            _try_send(sock, {"op": P.ERROR, "msg": "internal pserver error (see its log)"})
        finally:
            with self._conns_lock:
                self._conns.pop(id(conn), None)
            sock.close()

    # --- requests -----------------------------------------------------------------------
    def _register(self, conn: _Conn, h: dict, n: int) -> None:
        trainer = h["trainer"]
        dense = [(str(k), safe_dtype(dt), safe_shape(sh)) for k, dt, sh in h.get("dense", [])]
        sparse = [_sparse_meta(m, self.cfg.max_frame) for m in h.get("sparse", [])]
        init = bool(h.get("init"))
        _expect(n, sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in dense)
                if init else 0, "register")
        values = [np.empty(shape, dtype) for _, dtype, shape in dense] if init else None
        if values:
            _recv_into(conn.sock, values)
        step = self._waiting(conn, self.shard.register, trainer, sync=h.get("sync", True),
                             opt_config=h["opt"], fingerprint=h.get("fp"), dense=dense,
                             init_values=values, sparse=sparse,
                             timeout=self.cfg.register_timeout)
        conn.trainer = trainer
        wire.send_frame(conn.sock, {"op": P.OK, "step": step, "pserver_id": self.cfg.pserver_id,
                                    "trainers": self.cfg.trainers})

    def _step(self, conn: _Conn, h: dict, n: int) -> None:
        keys, trainer, step = list(h["keys"]), h["trainer"], int(h["step"])
        held = self.shard.check_keys(keys)
        _expect(n, sum(a.nbytes for a in held), "step")
        if self.shard.sync:
            bufs = self.shard.grad_buffers(trainer, keys)
            _recv_into(conn.sock, bufs)
            new_step = self._waiting(conn, self.shard.push_sync, trainer, step)
        else:
            bufs = conn.grad_buffers(keys, held)
            _recv_into(conn.sock, bufs)
            new_step = self.shard.push_async(keys, bufs)
        wire.send_frame(conn.sock, {"op": P.OK, "step": new_step}, self.shard.values(keys))

    def _pull(self, conn: _Conn, h: dict, n: int) -> None:
        _expect(n, 0, "pull")
        keys = list(h["keys"])
        wire.send_frame(conn.sock, {"op": P.OK, "step": self.shard.step},
                        self.shard.values(keys))

    def _sparse_ids(self, conn: _Conn, h: dict, n: int, with_rows: bool):
        table = self.shard.table(h["table"])
        count = int(h["n"])
        row_bytes = table.dim * table.dtype.itemsize if with_rows else 0
        if count < 0:
            raise BadRequest("negative id count")
        _expect(n, count * (8 + row_bytes), h["op"])
        ids = np.empty(count, dtype=np.int64)
        rows = np.empty((count, table.dim), dtype=table.dtype) if with_rows else None
        _recv_into(conn.sock, [ids] + ([rows] if with_rows else []))
        return table, ids, rows

    def _spull(self, conn: _Conn, h: dict, n: int) -> None:
        table, ids, _ = self._sparse_ids(conn, h, n, with_rows=False)
        wire.send_frame(conn.sock, {"op": P.OK}, [self.shard.sparse_pull(table.name, ids)])

    def _spush(self, conn: _Conn, h: dict, n: int) -> None:
        table, ids, rows = self._sparse_ids(conn, h, n, with_rows=True)
        self.shard.sparse_push(table.name, ids, rows, h.get("trainer"))
        wire.send_frame(conn.sock, {"op": P.OK})

    def _leave(self, conn: _Conn, h: dict, n: int) -> None:
        _expect(n, 0, "leave")
        self.shard.leave(h["trainer"])
        conn.trainer = None
        wire.send_frame(conn.sock, {"op": P.OK})
        if self.cfg.exit_when_done:
            with self.shard.cond:
                done = len(self.shard.left) >= self.shard.trainers
            if done:
                log.info("every trainer has left: stopping (--exit-when-done)")
                self.stop_event.set()

    def _stats(self, conn: _Conn, h: dict, n: int) -> None:
        _expect(n, 0, "stats")
        wire.send_frame(conn.sock, {"op": P.OK, **self.state()})


def _sparse_meta(m: dict, max_frame: int) -> dict:
    if not isinstance(m.get("name"), str):
        raise BadRequest("sparse table without a name")
    meta = {"name": m["name"], "dim": int(m["dim"]), "dict_size": int(m["dict_size"]),
            "dtype": safe_dtype(m.get("dtype", "<f4")).str, "init": str(m.get("init", "uniform")),
            "scale": float(m.get("scale", 0.01)), "seed": int(m.get("seed", 0))}
    if meta["dim"] * np.dtype(meta["dtype"]).itemsize > max_frame:
        raise BadRequest(f"sparse table {meta['name']!r}: a row of {meta['dim']} columns is "
                         "larger than the frame limit")
    return meta


_WAIT_HEAD = msgpack.packb({"op": P.WAIT})


def _try_send(sock, header) -> None:
    try:
        wire.send_frame(sock, header)
    except OSError:
        pass



