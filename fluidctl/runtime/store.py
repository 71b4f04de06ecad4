"""The rendezvous store: a small TCP key-value store that rank 0 serves at PADDLE_MASTER.

Ranks use it once at start-up (who is where, shared-memory names, the NCCL unique id) and for
slow-path barriers. Values are bytes; ``get``/``wait`` block on the server until the keys exist
or the caller's timeout runs out, and the error then names the keys (hence the ranks) that never
appeared. A barrier is one counter request per rank and ``join`` exchanges the ranks' records
(each gets its node's share, computed once by the server): no request grows with the world
(``storeserver``). Every connection goes through ``wire`` (frames + HMAC handshake with the
job token, run by ``wire.Acceptor``: bounded, deadline-limited, no thread until the peer has
authenticated); a peer that sends garbage or the wrong token loses its connection and the
server keeps serving.
There is no store without a token.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Iterable, List, Optional

from fluidctl.runtime import wire
from fluidctl.runtime.storeserver import MAX_VALUE, StoreServer, listen  # noqa: F401 (the API)


class StoreTimeout(TimeoutError):
    """Keys did not appear in time; ``missing`` lists them (the first few of ``total``)."""

    def __init__(self, message: str, missing: List, total: Optional[int] = None):
        super().__init__(message)
        self.missing = missing
        self.total = len(missing) if total is None else total


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

    def wait_any(self, keys: Iterable[str], timeout: float) -> dict:
        """Block on the server until one of ``keys`` exists (or ``timeout``); {key: value} of
        those present, empty when none appeared in time."""
        keys = list(keys)
        reply, value = self._call({"op": "wait", "keys": keys, "timeout": timeout,
                                   "fetch": True, "any": True}, io_timeout=timeout)
        if not reply.get("ok"):
            return {}
        out, pos = {}, 0
        for key, size, present in zip(keys, reply["sizes"], reply["present"]):
            if present:
                out[key] = bytes(value[pos:pos + size])
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

    JOIN_CHUNK = 256        # records per join request (a request stays under MAX_REQUEST)

    def join(self, group: str, world: int, records: List[dict],
             timeout: Optional[float] = None, read: bool = False) -> List[dict]:
        """Send this member's rank records ({rank, ep, node, pid}) and block until the whole
        world has joined; return the view of each node the records are on
        (``rendezvous.Layout.view``). A timeout's ``missing`` names the absent ranks.
        ``read``: only read the views of a finished layout (records: just {"rank"}).
        A node agent's records go JOIN_CHUNK at a time, the last one waiting for the world."""
        timeout = self.timeout if timeout is None else timeout
        while len(records) > self.JOIN_CHUNK and not read:
            chunk, records = records[:self.JOIN_CHUNK], records[self.JOIN_CHUNK:]
            reply, _ = self._call({"op": "join", "key": group, "n": int(world),
                                   "records": chunk, "more": True})
            if not reply.get("ok"):
                raise ValueError(f"rank {self.rank}: the store refused the join: "
                                 f"{reply.get('error')}")
        reply, _ = self._call({"op": "join", "key": group, "n": int(world), "records": records,
                               "timeout": timeout, "read": read}, io_timeout=timeout)
        if not reply.get("ok"):
            if "error" in reply:
                raise ValueError(f"rank {self.rank}: the store refused the join: "
                                 f"{reply['error']}")
            raise StoreTimeout(_absent(self.rank, reply, "join", timeout), reply["missing"],
                               reply.get("missing_count"))
        return reply["views"]

    def absent(self, name: str, n: int):
        """(the first few ranks that have not reached barrier ``name``, how many in all),
        without arriving there."""
        reply, _ = self._call({"op": "barrier", "key": name, "rank": self.rank, "n": int(n),
                               "peek": True})
        if reply.get("ok"):
            return [], 0
        if "error" in reply:
            raise ValueError(f"rank {self.rank}: barrier '{name}': {reply['error']}")
        return reply["missing"], reply.get("missing_count", len(reply["missing"]))

    def barrier(self, name: str, ranks, timeout: Optional[float] = None,
                describe=lambda r: f"rank {r}") -> None:
        """Every rank of ``ranks`` (a list, or a world size) arrives and waits for all: one
        counter request, whatever the size; the error names the ranks that did not come."""
        timeout = self.timeout if timeout is None else timeout
        header = {"op": "barrier", "key": name, "rank": self.rank, "timeout": timeout}
        if isinstance(ranks, int):
            header["n"] = ranks
        else:
            header["ranks"] = list(ranks)
            header["n"] = len(header["ranks"])
        reply, _ = self._call(header, io_timeout=timeout)
        if reply.get("ok"):
            return
        if "error" in reply:
            raise ValueError(f"rank {self.rank}: barrier '{name}': {reply['error']}")
        named = ", ".join(describe(r) for r in reply["missing"])
        more = reply.get("missing_count", 0) - len(reply["missing"])
        raise StoreTimeout(
            f"rank {self.rank}: {named}{f' and {more} more' if more > 0 else ''} did not reach "
            f"'{name}' within {timeout:g}s (did it crash or start late? check its log)",
            reply["missing"], reply.get("missing_count"))


def _absent(rank: int, reply: dict, what: str, timeout: float) -> str:
    missing = reply["missing"]
    more = reply.get("missing_count", 0) - len(missing)
    return (f"rank {rank}: rank(s) {', '.join(map(str, missing))}"
            f"{f' and {more} more' if more > 0 else ''} did not {what} within {timeout:g}s")
