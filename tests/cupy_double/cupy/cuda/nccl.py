"""cupy.cuda.nccl of the double, from cupy_backends/cuda/libs/nccl.pyx (v13.6.0 and v14.2.0).

The signatures, constants, NcclError texts and id rules are the real ones: CuPy <= 13 hands out
the id as a tuple of C ``char`` values (signed on x86: -128..127) and its constructor takes
``tuple`` (length 128, each value must fit a C char, else OverflowError); CuPy 14 uses ``bytes``
of exactly 128 (ValueError otherwise, TypeError for anything but bytes).

The collectives really happen between processes: ``get_unique_id`` starts a small hub (a TCP
socket on 127.0.0.1 in the calling process, its port written into the id), every communicator
connects to it, and each call ships the send buffer's bytes, read from its device pointer, to
the hub, which reduces them with numpy and sends each rank what NCCL would write into its
receive buffer. Calls are queued on the given stream and run in order on that stream's thread,
as on a GPU. Calls that disagree between ranks (count, type, op, root) hang, as NCCL's would.

A dead peer, as NCCL sees it (src/proxy.cc, transport/net*.cc): only the network transport
between nodes notices a closed connection, in its proxy thread, and reports
``ncclRemoteError`` through ``check_async_error``; peers on the same node talk through P2P /
SHM with no proxy work, so a same-node death is never reported: the call just never finishes,
until ``abort()``. The double does the same: each communicator joins with its host
(CUPY_DOUBLE_HOST, else the hostname), and the hub (which lives in the process that called
``get_unique_id``) tells only members on other hosts.

Init refuses what ncclCommInitRank refuses (src/init.cc, initTransportsRank): two ranks on one
GPU of one host ("Duplicate GPU detected", ncclInvalidUsage), unless NCCL >= 2.30 and
NCCL_MULTI_RANK_GPU_ENABLE=1. The physical GPU is the CUDA_VISIBLE_DEVICES entry of the
communicator's device. CUPY_DOUBLE_NCCL_VERSION sets get_version() (default 23203: 2.32.3).
"""
import functools
import os
import platform
import socket
import struct
import threading

import numpy as np

from cupy import _double

available = os.environ.get("CUPY_DOUBLE_NCCL", "1") != "0"
_V14 = int(__import__("cupy").__version__.split(".")[0]) >= 14
# the id as bytes came during the 14 pre-releases: 14.0.0a1 still hands out and takes a tuple
_BYTES_ID = _V14 and __import__("cupy").__version__ != "14.0.0a1"
_ID_BYTES = 128
_CHAR_SIGNED = platform.machine().lower() not in ("aarch64", "arm64", "ppc64le", "s390x")

_ERROR2 = {0: "NCCL_ERROR_SUCCESS", 1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR",
           2: "NCCL_ERROR_SYSTEM_ERROR", 3: "NCCL_ERROR_INTERNAL_ERROR",
           4: "NCCL_ERROR_INVALID_ARGUMENT", 5: "NCCL_ERROR_INVALID_USAGE",
           6: "NCCL_ERROR_REMOTE_ERROR"}
_TEXT = {1: "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
         2: "unhandled system error (run with NCCL_DEBUG=INFO for details)",
         3: "internal error - please report this issue to the NCCL developers",
         4: "invalid argument (run with NCCL_DEBUG=WARN for details)",
         5: "invalid usage (run with NCCL_DEBUG=WARN for details)",
         6: "remote process exited or there was a network error"}

_MAGIC = b"NCCLDBL1"
_VERSION = int(os.environ.get("CUPY_DOUBLE_NCCL_VERSION", "23203"))


def _host_hash() -> bytes:
    import hashlib
    host = os.environ.get("CUPY_DOUBLE_HOST") or socket.gethostname()
    return hashlib.blake2b(host.encode(), digest_size=8).digest()


def _physical(device: int) -> bytes:
    """What NCCL compares as busId: the CUDA_VISIBLE_DEVICES entry behind ``device``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    items = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else []
    name = items[device] if device < len(items) else str(device)
    return name.encode()[:64].ljust(64, b"\0")


def _multi_rank_gpu() -> bool:
    return _VERSION >= 23000 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE", "0") == "1"


def _define():
    names = dict(
        NCCL_SUM=0, NCCL_PROD=1, NCCL_MAX=2, NCCL_MIN=3, NCCL_AVG=4,
        NCCL_INT8=0, NCCL_CHAR=0, NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT=2, NCCL_UINT32=3,
        NCCL_INT64=4, NCCL_UINT64=5, NCCL_FLOAT16=6, NCCL_HALF=6, NCCL_FLOAT32=7, NCCL_FLOAT=7,
        NCCL_FLOAT64=8, NCCL_DOUBLE=8, NCCL_BFLOAT16=9)
    globals().update(names)


def _numpy_dtype(code):
    if code == 9:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64,
                     5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64}[code])


class NcclError(RuntimeError):
    # nccl.pyx: ERROR2 stops at 6, so ncclInProgress (7) and ncclTimeout (8, NCCL 2.30) raise
    # KeyError(status) from here, as in real CuPy
    def __init__(self, status):
        self.status = status
        super().__init__("%s: %s" % (_ERROR2[status], _TEXT[status]))

    def __reduce__(self):
        return (type(self), (self.status,))


def check_status(status):
    if status != 0:
        raise NcclError(status)


def get_build_version():
    return 22501


def get_version():
    return _VERSION


# --- the hub: where the ranks' buffers meet ---------------------------------------------
def _send(sock, header: bytes, payload: bytes = b""):
    sock.sendall(struct.pack("!II", len(header), len(payload)) + header + payload)


def _recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("closed")
        got += k
    return bytes(buf)


def _recv(sock):
    hl, pl = struct.unpack("!II", _recv_exact(sock, 8))
    return _recv_exact(sock, hl), _recv_exact(sock, pl)


class _Hub:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.groups = {}         # uid -> {"n", "members": {rank: sock}, "calls": {seq: {...}}}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        group = rank = None
        try:
            header, _ = _recv(conn)
            uid, n, rank = header[:128], *struct.unpack("!ii", header[128:136])
            host, gpu, multi = header[136:144], header[144:208], header[208:209] == b"1"
            with self.lock:
                group = self.groups.setdefault(uid, {"n": n, "members": {}, "calls": {},
                                                     "hosts": {}, "gpus": {},
                                                     "broken": False})
                if rank in group["members"] or not 0 <= rank < n or group["n"] != n:
                    _send(conn, b"invalid")
                    return
                group["members"][rank] = conn
                group["hosts"][rank] = host
                group["gpus"][rank] = (host, gpu, multi)
                if len(group["members"]) == n:
                    places = list(group["gpus"].values())
                    dup = any(places.count(p) > 1 and not p[2] for p in places)
                    for s in group["members"].values():
                        _send(s, b"duplicate" if dup else b"ready")
            while True:
                header, payload = _recv(conn)
                self._arrive(group, rank, header, payload)
        except (ConnectionError, OSError, struct.error):
            pass
        if group is not None:
            with self.lock:
                if group["members"].get(rank) is conn:
                    group["broken"] = True
                    dead_host = group["hosts"].get(rank)
                    for r, s in group["members"].items():
                        # only the network transport (another host) notices
                        if r != rank and group["hosts"].get(r) != dead_host:
                            try:
                                _send(s, b"remote")
                            except OSError:
                                pass

    def _arrive(self, group, rank, header, payload):
        seq, kind, count, dtype, op, root = struct.unpack("!qiqiii", header)
        with self.lock:
            call = group["calls"].setdefault(seq, {})
            call[rank] = ((kind, count, dtype, op, root), payload)
            if len(call) < group["n"]:
                return
            del group["calls"][seq]
            sigs = {sig for sig, _ in call.values()}
            if len(sigs) != 1:
                return                       # NCCL would hang on mismatched calls: so do we
            (kind, count, dtype, op, root), = sigs
            dt = _numpy_dtype(dtype)
            parts = [np.frombuffer(call[r][1], dtype=dt) for r in range(group["n"])]
            out = _compute(kind, parts, op, root, group["n"])
            for r, s in group["members"].items():
                _send(s, b"done", out[r].tobytes() if out[r] is not None else b"")


def _reduce(parts, op, n):
    fn = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum, 4: np.add}[op]
    acc = parts[0].copy()
    for p in parts[1:]:
        acc = fn(acc, p)
    if op == 4:
        acc = (acc / n).astype(parts[0].dtype)
    return acc


def _compute(kind, parts, op, root, n):
    if kind == 0:                                           # allReduce
        red = _reduce(parts, op, n)
        return [red] * n
    if kind == 1:                                           # reduce: only root's recvbuf
        return [_reduce(parts, op, n) if r == root else None for r in range(n)]
    if kind == 2:                                           # broadcast
        return [parts[root]] * n
    if kind == 3:                                           # allGather
        return [np.concatenate(parts)] * n
    red = _reduce(parts, op, n)                             # reduceScatter
    k = len(red) // n
    return [red[r * k:(r + 1) * k] for r in range(n)]


_hub = None
_hub_lock = threading.Lock()


def get_unique_id():
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = _Hub()
    # magic, the hub's port, the hub's host (its death is a same-node one for that host)
    raw = _MAGIC + struct.pack("!H", _hub.port) + _host_hash() + os.urandom(_ID_BYTES - 18)
    if _BYTES_ID:
        return raw
    # CuPy <= 13: tuple([<char>uniqueId.internal[i] ...]): C char's signedness
    return tuple((b - 256 if b > 127 else b) if _CHAR_SIGNED else b for b in raw)


def _id_bytes(commId):
    if _BYTES_ID:
        if not isinstance(commId, bytes):
            raise TypeError("Argument 'commId' has incorrect type (expected bytes, got %s)"
                            % type(commId).__name__)
        if len(commId) != _ID_BYTES:
            raise ValueError(f"commId length {len(commId)} != {_ID_BYTES}.")
        return commId
    if not isinstance(commId, tuple):
        raise TypeError("Argument 'commId' has incorrect type (expected tuple, got %s)"
                        % type(commId).__name__)
    assert len(commId) == _ID_BYTES
    lo, hi = (-128, 127) if _CHAR_SIGNED else (0, 255)
    out = bytearray()
    for v in commId:
        v = int(v)
        if not lo <= v <= hi:
            raise OverflowError("value too large to convert to char" if v > hi else
                                "can't convert negative value to char")
        out.append(v & 0xFF)
    return bytes(out)


class _Replay:
    """An NCCL call recorded by a stream capture: each launch of the graph issues it anew (its
    own collective number, in issue order with the communicator's other calls)."""

    def __init__(self, issue):
        self.replay = issue

    def __call__(self):
        raise AssertionError("a captured NCCL call runs through Graph.launch")


_KINDS = {"allReduce": 0, "reduce": 1, "broadcast": 2, "allGather": 3, "reduceScatter": 4}


class NcclCommunicator:
    if _V14:
        def __init__(self, ndev, commId, rank, config=None):
            self._init(ndev, commId, rank)
    else:
        def __init__(self, ndev, commId, rank):
            self._init(ndev, commId, rank)

    def _init(self, ndev, commId, rank):
        ndev, rank = int(ndev), int(rank)
        uid = _id_bytes(commId)
        self._comm = 0
        if os.environ.get("NCCL_COMM_BLOCKING", "") == "0":
            check_status(7)          # ncclCommInitRank returns ncclInProgress: KeyError(7)
        self._device = _double.current_device()
        if not 0 <= self._device < _double.device_count():
            raise NcclError(1)
        if uid[:8] != _MAGIC or not 0 <= rank < ndev:
            raise NcclError(4)
        port, = struct.unpack("!H", uid[8:10])
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._host = _host_hash()
        self._hub_host = uid[10:18]
        _send(self._sock, uid + struct.pack("!ii", ndev, rank) + self._host +
              _physical(self._device) + (b"1" if _multi_rank_gpu() else b"0"))
        answer, _ = _recv(self._sock)            # ncclCommInitRank blocks until all joined
        if answer != b"ready":                   # "Duplicate GPU detected": ncclInvalidUsage
            self._sock.close()
            raise NcclError(5)
        self._n, self._rank = ndev, rank
        self._comm = id(self)
        self._seq = 0
        self._error = 0
        self._aborted = threading.Event()
        self._io = threading.Lock()
        self._issued = threading.Event()         # the last call issued has finished
        self._issued.set()

    def __del__(self):
        self.destroy()

    @property
    def comm(self):
        return self._comm

    def destroy(self):
        if getattr(self, "_comm", 0):
            self._comm = 0
            self._sock.close()

    def abort(self):
        if self._comm:
            self._comm = 0
            self._aborted.set()
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def device_id(self):
        self._need()
        return self._device

    def rank_id(self):
        self._need()
        return self._rank

    def size(self):
        self._need()
        return self._n

    def check_async_error(self):
        # nccl.pyx: ncclCommGetAsyncError(self._comm, ...) checks the async error, then the
        # call's result: on a destroyed or aborted communicator (_comm = 0) that is
        # ncclInvalidArgument
        check_status(self._error if self._comm else 0)
        if not self._comm:
            raise NcclError(4)

    def _need(self):
        if not self._comm:
            raise NcclError(4)

    # --- collectives (positional signatures as in nccl.pyx) -------------------------------
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._call("allReduce", sendbuf, recvbuf, count, count, datatype, op, 0, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._call("reduce", sendbuf, recvbuf, count, count, datatype, op, root, stream)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._call("broadcast", sendbuff, recvbuff, count, count, datatype, 0, root, stream)

    def bcast(self, buff, count, datatype, root, stream):
        self._call("broadcast", buff, buff, count, count, datatype, 0, root, stream)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._call("reduceScatter", sendbuf, recvbuf, recvcount * self._n if self._comm else 0,
                   recvcount, datatype, op, 0, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._call("allGather", sendbuf, recvbuf, count, count * self._n if self._comm else 0,
                   datatype, 0, 0, stream)

    def _call(self, kind, send, recv, send_count, recv_count, datatype, op, root, stream):
        for v in (send, recv, send_count, recv_count, datatype, op, root, stream):
            if not isinstance(v, (int, np.integer)):      # Cython's intptr_t / size_t / int
                raise TypeError("an integer is required")
        if send_count < 0 or recv_count < 0:
            raise OverflowError("can't convert negative value to size_t")
        self._need()
        if not 0 <= datatype <= 9 or not 0 <= op <= 4 or not 0 <= root < self._n:
            raise NcclError(4)
        dt = _numpy_dtype(datatype)
        if op == 4 and dt.kind not in "f" and dt.name != "bfloat16":
            raise NcclError(4)
        size = dt.itemsize
        # enqueue.cc ArgsCheck: the pointers are checked only with NCCL_CHECK_POINTERS=1
        # (ncclInvalidArgument); otherwise a pointer that is not this device's memory faults
        # the kernel (cudaErrorIllegalAddress, sticky), found when the call runs
        needs_send = kind != "broadcast" or self._rank == root
        needs_recv = kind != "reduce" or self._rank == root
        bad_pointer = False
        for ptr, nbytes, needed in ((send, send_count * size, needs_send),
                                    (recv, recv_count * size, needs_recv)):
            if needed and nbytes and _double.lookup(int(ptr), nbytes) != self._device:
                if os.environ.get("NCCL_CHECK_POINTERS", "0") == "1":
                    raise NcclError(4)
                bad_pointer = True
        from cupy.cuda import stream_of
        s = stream_of(int(stream))
        if s is None or (s.device_id not in (-1, self._device)):
            # the launch on a handle that is no stream of this device fails in CUDA
            # (cudaErrorInvalidResourceHandle): NCCL's CUDACHECK -> ncclUnhandledCudaError
            raise NcclError(1)
        if bad_pointer:
            s._enqueue_async(lambda: _double.fault(700))
            return
        issue = functools.partial(self._issue, kind, send, recv, send_count, recv_count,
                                  datatype, op, root, needs_send, needs_recv, size)
        if s._captured is not None:               # stream capture: issued at each launch
            s._captured.append(_Replay(issue))
            return
        issue(s)

    def _issue(self, kind, send, recv, send_count, recv_count, datatype, op, root, needs_send,
               needs_recv, size, s):
        if needs_send and send_count:
            _double.used(int(send), s)            # NCCL reads on its stream: ordered?
        s._tick += 1
        if needs_recv and recv_count:
            _double.wrote(int(recv), s)
        self._seq += 1
        header = struct.pack("!qiqiii", self._seq, _KINDS[kind], send_count, datatype, op, root)
        args = (int(send), int(recv), send_count * size if needs_send else 0, recv_count * size,
                needs_recv)
        launch = (s, self._in_issue_order(lambda: self._run(header, *args)))
        if getattr(_group, "depth", 0):           # inside groupStart/groupEnd: launched at
            _group.pending.append(launch)         # the outermost groupEnd, as NCCL does
        else:
            s._enqueue_async(launch[1])

    def _in_issue_order(self, run):
        """NCCL runs one communicator's kernels in the order they were issued, whatever the
        streams (enqueue.cc: the launch stream waits on the communicator's ``deviceStream``,
        which then waits on it): each call's work first waits for the previous call's."""
        before, finished = self._issued, threading.Event()
        self._issued = finished

        def ordered():
            try:
                before.wait()
                run()
            finally:
                finished.set()
        return ordered

    def _run(self, header, send, recv, send_bytes, recv_bytes, needs_recv):
        if self._aborted.is_set():
            return
        if _double.sticky:                    # the context is dead: this kernel never runs,
            return                            # the peers' kernels wait for its part
        try:
            payload = _double.memory(send, send_bytes).tobytes()
            with self._io:
                _send(self._sock, header, payload)
                answer, data = _recv(self._sock)
        except OSError:                       # the hub's process is gone
            answer, data = (b"hang" if self._hub_host == self._host else b"remote"), b""
        if answer != b"done":
            if answer == b"remote":           # the net transport's proxy saw it
                self._error = 6
            self._aborted.wait()              # NCCL's kernel spins until the comm is aborted
            return
        if needs_recv and len(data) == recv_bytes:
            _double.memory(recv, recv_bytes)[:] = np.frombuffer(data, np.uint8)

    @staticmethod
    def initAll(devices):
        raise NotImplementedError("the double serves one device per process")


if _V14:
    class NcclConfig:
        def __init__(self, split_share=0):
            self.split_share = split_share


_group = threading.local()          # NCCL's group state is per thread


def groupStart():
    # nccl.pyx: ncclGroupStart(); calls until the matching groupEnd are queued, not launched
    _group.depth = getattr(_group, "depth", 0) + 1
    if _group.depth == 1:
        _group.pending = []


def groupEnd():
    # ncclGroupEnd(): without a groupStart, ncclInvalidUsage (5); the outermost one launches
    if not getattr(_group, "depth", 0):
        raise NcclError(5)
    _group.depth -= 1
    if _group.depth == 0:
        pending, _group.pending = _group.pending, []
        for stream, fn in pending:
            stream._enqueue_async(fn)


if available:
    _define()
else:            # cupy/cuda/nccl.py when libnccl is missing: only `available` is defined
    for _name in [n for n in dir() if not n.startswith("_") and n not in ("available", "os",
                                                                          "np", "platform",
                                                                          "socket", "struct",
                                                                          "threading")]:
        del globals()[_name]
