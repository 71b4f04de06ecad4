"""The rendezvous store: a small TCP key-value store that rank 0 serves at PADDLE_MASTER.

Ranks use it once at start-up (who is where, shared-memory names, the NCCL unique id) and for
slow-path barriers. Values are bytes; ``get``/``wait`` block on the server until the keys exist
or the caller's timeout runs out, and the error then names the keys (hence the ranks) that never
appeared. Every connection goes through ``wire`` (frames + HMAC handshake with the job token,
run by ``wire.Acceptor``: bounded, deadline-limited, no thread until the peer has authenticated);
a peer that sends garbage or the wrong token loses its connection and the server keeps serving.
There is no store without a token.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Dict, Iterable, List, Optional

from fluidctl.runtime import wire

log = logging.getLogger("fluidctl.store")

MAX_VALUE = 64 << 20        # store values are small: addresses, ids, metadata


class StoreTimeout(TimeoutError):
    """Keys did not appear in time; ``missing`` lists them."""

    def __init__(self, message: str, missing: List[str]):
        super().__init__(message)
        self.missing = missing


class StoreServer:
    """Serve the store on ``host:port`` from daemon threads (one per authenticated connection)."""

    def __init__(self, host: str, port: int, token: Optional[str]):
        if not token:
            raise ValueError("the rendezvous store needs a job token (FLUIDCTL_JOB_TOKEN)")
        self.token = token
        self._data: Dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._active = 0
        self._drop_log = wire.DropLog(log, "store: dropping", prefix="store: ")
        self._sock = listen(host, port)
        self.port = self._sock.getsockname()[1]
        self._acceptor = wire.Acceptor([self._sock], token, self._on_peer, self._on_drop,
                                       name="fluidctl-store").start()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no client is connected (others have read their answers), up to timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._active and time.monotonic() < deadline:
                self._cond.wait(max(0.0, min(0.5, deadline - time.monotonic())))
            return not self._active

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        self._acceptor.close()
        self._drop_log.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _on_drop(self, addr, why: str) -> None:
        self._drop_log(f"{addr[0]}:{addr[1]}", why)     # rate-limited

    def _on_peer(self, conn: socket.socket, addr) -> None:
        with self._cond:
            self._active += 1
        threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                         name=f"fluidctl-store-{addr[1]}").start()

    def _serve(self, conn: socket.socket, addr) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._closed:
                try:
                    header, payload = wire.recv_frame(conn, max_payload=MAX_VALUE)
                except wire.PeerClosed:
                    return
                try:
                    reply, value = self._handle(header, payload)
                except (TypeError, ValueError, OverflowError) as exc:
                    reply, value = {"ok": False, "error": f"bad request: {exc}"}, None
                wire.send_frame(conn, reply, [value] if value else [])
        except (OSError, wire.WireError) as exc:
            self._drop_log(f"{addr[0]}:{addr[1]}", exc)
        finally:
            conn.close()
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _handle(self, header: dict, payload: memoryview):
        op, key = header.get("op"), header.get("key")
        if op == "set" and isinstance(key, str):
            with self._cond:
                self._data[key] = bytes(payload)
                self._cond.notify_all()
            return {"ok": True}, None
        if op == "add" and isinstance(key, str) and isinstance(header.get("n"), int):
            with self._cond:
                value = int(self._data.get(key, b"0")) + header["n"]
                self._data[key] = str(value).encode()
                self._cond.notify_all()
            return {"ok": True, "value": value}, None
        if op == "wait" and isinstance(header.get("keys"), list):
            keys = [k for k in header["keys"] if isinstance(k, str)]
            timeout = float(header.get("timeout") or 0)
            deadline = time.monotonic() + timeout
            with self._cond:
                while True:
                    missing = [k for k in keys if k not in self._data]
                    left = deadline - time.monotonic()
                    if not missing or left <= 0 or self._closed:
                        break
                    self._cond.wait(min(left, 1.0))
            if missing:
                return {"ok": False, "missing": missing}, None
            if header.get("fetch"):
                values = [self._data[k] for k in keys]
                return {"ok": True, "sizes": [len(v) for v in values]}, b"".join(values)
            return {"ok": True}, None
        if op == "delete" and isinstance(key, str):
            with self._cond:
                existed = self._data.pop(key, None) is not None
            return {"ok": True, "existed": existed}, None
        return {"ok": False, "error": f"bad request {op!r}"}, None


def listen(host: str, port: int, fallback_to_any: bool = True) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    from fluidctl.net import bind_socket
    try:
        sock = bind_socket(host, port)
    except OSError:
        if not fallback_to_any or host in ("", "0.0.0.0"):
            raise
        sock = bind_socket("", port)   # the master name may not be a local address (NAT, alias)
    sock.listen(256)
    return sock


class StoreClient:
    """One authenticated connection to the store; thread-safe (one request at a time)."""

    def __init__(self, endpoint: str, token: Optional[str], timeout: float, rank: int = -1):
        self.endpoint = endpoint
        self.timeout = timeout
        self.rank = rank
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout
        delay, last = 0.01, None
        while True:
            try:
                self._sock = wire.connect(endpoint, token,
                                          timeout=max(0.1, min(10.0, deadline - time.monotonic())))
                break
            except (OSError, wire.WireError) as exc:
                last = exc
                if isinstance(exc, wire.AuthError):
                    raise ConnectionError(
                        f"rank {rank}: the rendezvous store at {endpoint} rejected this process "
                        f"({exc}; every rank needs the same FLUIDCTL_JOB_TOKEN)") from None
            if time.monotonic() + delay > deadline:
                raise StoreTimeout(
                    f"rank {rank}: rank 0's rendezvous store at {endpoint} did not answer within "
                    f"{timeout:g}s ({last}); is rank 0 running? check its log, or raise "
                    "FLUIDCTL_TIMEOUT", [endpoint])
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def close(self) -> None:
        self._sock.close()

    def _call(self, header: dict, payload=None, io_timeout: Optional[float] = None):
        with self._lock:
            self._sock.settimeout((io_timeout or self.timeout) + 10.0)
            try:
                wire.send_frame(self._sock, header, [payload] if payload else [])
                reply, value = wire.recv_frame(self._sock, max_payload=1 << 40)
            except (OSError, wire.WireError) as exc:
                raise ConnectionError(f"rank {self.rank}: lost the rendezvous store at "
                                      f"{self.endpoint} ({exc}); did rank 0 exit?") from None
        return reply, value

    def set(self, key: str, value: bytes) -> None:
        self._call({"op": "set", "key": key}, value)

    def add(self, key: str, n: int = 1) -> int:
        return self._call({"op": "add", "key": key, "n": int(n)})[0]["value"]

    def delete(self, key: str) -> bool:
        return self._call({"op": "delete", "key": key})[0]["existed"]

    def wait(self, keys: Iterable[str], timeout: Optional[float] = None) -> None:
        self._wait(list(keys), timeout, fetch=False)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        return self.multi_get([key], timeout)[0]

    def multi_get(self, keys: Iterable[str], timeout: Optional[float] = None) -> List[bytes]:
        keys = list(keys)
        reply, value = self._wait(keys, timeout, fetch=True)
        out, pos = [], 0
        for size in reply["sizes"]:
            out.append(bytes(value[pos:pos + size]))
            pos += size
        return out

    def _wait(self, keys: List[str], timeout: Optional[float], fetch: bool):
        timeout = self.timeout if timeout is None else timeout
        reply, value = self._call({"op": "wait", "keys": keys, "timeout": timeout,
                                   "fetch": fetch}, io_timeout=timeout)
        if not reply.get("ok"):
            missing = reply.get("missing", [])
            raise StoreTimeout(f"rank {self.rank}: timed out after {timeout:g}s waiting for "
                               f"{', '.join(missing[:8])}", missing)
        return reply, value

    def barrier(self, name: str, ranks, timeout: Optional[float] = None,
                describe=lambda r: f"rank {r}") -> None:
        """Every rank of ``ranks`` (a list, or a world size) sets ``name/<rank>`` and waits for
        all; the error names the ranks that did not come."""
        ranks = range(ranks) if isinstance(ranks, int) else ranks
        self.set(f"{name}/{self.rank}", b"1")
        try:
            self.wait([f"{name}/{r}" for r in ranks], timeout)
        except StoreTimeout as exc:
            ranks = [int(k.rpartition("/")[2]) for k in exc.missing]
            raise StoreTimeout(
                f"rank {self.rank}: {', '.join(describe(r) for r in ranks)} did not reach "
                f"'{name}' within {self.timeout if timeout is None else timeout:g}s "
                "(did it crash or start late? check its log)", exc.missing) from None
