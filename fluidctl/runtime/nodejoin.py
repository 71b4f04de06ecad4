"""A node's one join: the node agent is the unit of rendezvous, not the rank.

The process that starts a node's ranks (the ssh/fabric node agent, or the launcher itself for a
local job) listens on a Unix socket in the node's diagnostics directory (FLUIDCTL_NODE_JOIN).
Each rank of the node sends its record there (``{rank, ep, node, pid}``) instead of to rank 0's
store; once every rank of the node has, the agent sends ONE ``join`` with all of them to the
store, and answers each rank with its node's view (``rendezvous.Layout.view``). The root then
gets one message per node, not per rank, and no rank ever receives the world's endpoints.

The socket lives in a directory only this user can enter (``paths.DiagDir``), so a connection
to it is one of the node's own processes; what crosses the network (the agent's join) is
authenticated by the job token like every other store request.

Under srun no agent starts the ranks: the node's first task (SLURM_LOCALID 0, told so by
``fluidctl worker`` in FLUIDCTL_NODE_JOIN_RANKS) serves its node's join from its own
``runtime.init()``, on a socket in a directory of this user on the node's own disk
(``paths.node_join_socket``), whose name every task of the node derives alike; the others wait
for it to appear. Under mpirun (``fluidctl worker``) the node's lowest rank does the same.
"""
from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from typing import Dict, List

from fluidctl.paths import UNIX_PATH_MAX as MAX_PATH
from fluidctl.runtime import wire

LAYOUT_GROUP = "layout"


class NodeJoinError(ConnectionError):
    """The node's join did not complete; ``missing`` names the first ranks that did not come
    (of ``total`` in all), as ``store.StoreTimeout`` does."""

    def __init__(self, message: str, missing: List, total: int):
        super().__init__(message)
        self.missing, self.total = missing, total


class NodeJoiner:
    """Serve one attempt's join for ``ranks`` (this node's collective ranks) on ``path``: a
    thread that lives until it has answered them, ``close()``, or ``timeout`` seconds."""

    def __init__(self, path: str, ranks, world: int, master: str, token: str, timeout: float):
        self.path, self.ranks, self.world = path, sorted(ranks), world
        self.master, self.token, self.timeout = master, token, timeout
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)
            os.chmod(path, 0o600)
            self._listener.listen(max(64, len(self.ranks)))
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._thread = threading.Thread(target=self._serve, name="fluidctl-node-join",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    # --- the one thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        conns: Dict[int, socket.socket] = {}
        records: Dict[int, dict] = {}
        try:
            deadline = time.monotonic() + self.timeout
            self._gather(conns, records, deadline)
            if set(records) != set(self.ranks):
                if conns:
                    absent = [r for r in self.ranks if r not in records]
                    self._answer_all(conns, {"ok": False, "missing": absent[:64],
                                             "missing_count": len(absent)})
                return
            self._answer_all(conns, self._join(records, deadline))
        except Exception as exc:          # a broken node join: its ranks say why and stop
            self._answer_all(conns, {"ok": False, "error": str(exc)})
        finally:
            for sock in conns.values():
                sock.close()
            self._listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _gather(self, conns, records, deadline: float) -> None:
        """Accept the node's ranks, one record each, until all are in, close or deadline."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        try:
            while len(records) < len(self.ranks) and not self._closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for key, _ in sel.select(min(0.5, left)):
                    if key.fileobj is self._listener:
                        try:
                            sock, _ = self._listener.accept()
                        except OSError:
                            continue
                        sock.setblocking(True)
                        sock.settimeout(5.0)      # a rank sends its record as it connects
                        sel.register(sock, selectors.EVENT_READ)
                        continue
                    sock = key.fileobj
                    sel.unregister(sock)
                    try:
                        header, _ = wire.recv_frame(sock, max_payload=0)
                        rank = header["record"]["rank"]
                    except (OSError, wire.WireError, KeyError, TypeError):
                        sock.close()
                        continue
                    if rank not in self.ranks or rank in records:
                        wire.send_frame(sock, {"ok": False, "error":
                                               f"rank {rank} is not one of this node's ranks "
                                               "still to join"})
                        sock.close()
                        continue
                    records[rank], conns[rank] = header["record"], sock
        finally:
            sel.close()

    def _join(self, records: Dict[int, dict], deadline: float) -> dict:
        """The node's one join at the store; {rank: view} or the reason it failed."""
        from fluidctl.runtime.store import StoreClient, StoreTimeout
        left = max(1.0, deadline - time.monotonic())
        try:
            client = StoreClient(self.master, self.token, left, rank=self.ranks[0])
        except StoreTimeout as exc:
            return {"ok": False, "error": str(exc)}
        try:
            views = client.join(LAYOUT_GROUP, self.world,
                                [records[r] for r in self.ranks], left)
        except StoreTimeout as exc:
            return {"ok": False, "missing": exc.missing, "missing_count": exc.total}
        finally:
            client.close()
        view_of = {}
        for view in views:
            for rank, _, _ in view["local"]:
                view_of[rank] = view
        return {"ok": True, "views": view_of}

    @staticmethod
    def _answer_all(conns: Dict[int, socket.socket], reply: dict) -> None:
        for rank, sock in conns.items():
            answer = reply
            if reply.get("ok"):
                answer = {"ok": True, "view": reply["views"][rank]}
            try:
                wire.send_frame(sock, answer)
            except OSError:
                pass


class NotServed(ConnectionError):
    """Nobody serves the node's join (its first task could not): join the store directly."""


def _connect(sock: socket.socket, path: str, timeout: float) -> None:
    """Connect to the node's join socket, waiting for it to appear while the node's first
    task starts (srun starts a node's tasks at once); NotServed when that task said it could
    not serve (``off`` marker)."""
    deadline, delay = time.monotonic() + timeout, 0.005
    while True:
        try:
            sock.connect(path)
            return
        except (FileNotFoundError, ConnectionRefusedError):
            if os.path.exists(off_marker(path)):
                raise NotServed(path) from None
            if time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


def off_marker(path: str) -> str:
    return path + ".off"


def join(path: str, record: dict, timeout: float) -> dict:
    """A rank's side: send ``record`` to its node's agent at ``path`` and return its node's
    view; NodeJoinError (naming the absent ranks) when the join did not complete, NotServed
    when nobody serves it."""
    rank = record["rank"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout + 10.0)       # the agent answers by its own deadline
    try:
        try:
            _connect(sock, path, timeout)
            wire.send_frame(sock, {"record": record})
            reply, _ = wire.recv_frame(sock, max_payload=0)
        except NotServed:
            raise
        except (OSError, wire.WireError) as exc:
            raise NodeJoinError(f"rank {rank}: lost its node agent's join at {path} ({exc})",
                                [], 0) from None
    finally:
        sock.close()
    if reply.get("ok"):
        return reply["view"]
    if "error" in reply:
        raise NodeJoinError(f"rank {rank}: its node's join failed: {reply['error']}", [], 0)
    raise NodeJoinError(f"rank {rank}: rank(s) did not join", reply["missing"],
                        reply.get("missing_count", len(reply["missing"])))


def usable(path: str) -> bool:
    """Whether ``path`` fits a Unix socket's address (else the ranks join the store)."""
    return len(os.fsencode(path)) <= MAX_PATH

