"""NCCL through ``cupy.cuda.nccl`` for CuPy arrays (GPU ranks).

Set-up (``setup``, called by ``init()`` on ranks with FLAGS_selected_gpus and backend nccl):

1. Each rank probes its own side: CuPy importable, the device usable (``Device(i).use()``),
   ``cupy.cuda.nccl.available``. The ranks publish the outcome through the rendezvous store and
   every rank decides on the same table: all ranks ok -> NCCL; no rank has CuPy -> CPU for all
   (with a warning); anything else -> the same CollectiveError on every rank, naming each rank's
   problem. So no rank ever waits in ncclCommInitRank for a peer that took another path.
2. Rank 0's unique id goes through the store as 128 bytes. CuPy 14 takes ``bytes`` (exactly
   128); CuPy <= 13 a ``tuple`` of C ``char`` values, signed on x86, unsigned on aarch64 (GH200)
   and ppc64le: the id is decoded for this machine's ``char`` (and retried in the other form if
   the constructor refuses a value with OverflowError).
3. The communicator is created in a helper thread bound to the rank's device, so the wait is
   bounded by the timeout; each rank publishes success or its NcclError, and any failure gives
   every rank the same CollectiveError.

Each collective (``run``):

- agrees on the metadata record (kind, op, dtype, shape, root, problems such as an array on
  another device) over the CPU communicator that ``init()`` built anyway: no GPU round trip, and
  the same CollectiveError on every rank for a mismatch;
- runs the NCCL call on fluidctl's own non-blocking stream of the rank's device, after an event
  recorded on the caller's current stream (so data produced there, blocking stream or not, is
  ready), and makes the caller's stream wait for the result;
- waits on the host once, for the call's completion event, polling ``check_async_error()`` to
  the deadline (FLUIDCTL_TIMEOUT). On an error or the deadline it aborts the communicator,
  publishes the first message through the store, and every rank raises that same
  CollectiveError (naming same-node ranks whose process is gone).
"""
from __future__ import annotations

import os
import platform
import sys
import threading
import time
from typing import List, Optional

import numpy as np

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.meta import CollectiveError

ID_KEY = "nccl/unique_id"
ERROR_KEY = "nccl/error"
INIT_ERROR = "nccl/init/error"        # the first error creating the communicator (all raise it)
INIT_DONE = "nccl/init/done"          # a counter of ranks whose communicator is up
INIT_ALL = "nccl/init/all"            # set by the last of them
INIT_REPORTED = "nccl/init/reported"  # a barrier each rank arrives at once its init ended
MAX_NAMED_RANKS = 16                  # ranks named one by one in a set-up error
INIT_SLICE = 0.5                      # seconds a parked wait lasts between pid/deadline checks
ID_BYTES = 128
CUDA_NOT_READY = 600          # cudaErrorNotReady: what cudaEventQuery says of pending work
_UNSIGNED_CHAR_MACHINES = ("aarch64", "arm64", "armv7l", "ppc64le", "ppc64", "s390x")


# --- the unique id ------------------------------------------------------------------------
def encode_unique_id(uid) -> bytes:
    """What ``get_unique_id()`` returned (bytes, or a tuple of signed or unsigned chars) as
    the 128 bytes the store carries."""
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(int(v) & 0xFF for v in uid)


def char_is_signed(machine: Optional[str] = None) -> bool:
    return (machine or platform.machine()).lower() not in _UNSIGNED_CHAR_MACHINES


def decode_unique_id(data: bytes, as_bytes: bool, signed: Optional[bool] = None):
    """CuPy 14: ``bytes``; CuPy <= 13: a tuple of C ``char`` values (``signed``: this
    machine's char unless given)."""
    if as_bytes:
        return bytes(data)
    if signed is None:
        signed = char_is_signed()
    return tuple(b - 256 if signed and b > 127 else b for b in data)


def cupy_major(cupy) -> int:
    try:
        return int(str(cupy.__version__).split(".")[0])
    except ValueError:
        return 14


def _wrong_id_type(exc: TypeError) -> bool:
    """Cython's "Argument 'commId' has incorrect type (expected tuple, got bytes)"."""
    return "commId" in str(exc)


def make_communicator(nccl, cupy, world_size: int, rank: int, data: bytes):
    """The id in the form this CuPy's constructor takes: ``bytes`` from CuPy 14 (the
    version says which to try first), a ``tuple`` of C chars before (and in 14.0.0a1); the
    constructor's own type check (TypeError naming commId) decides when the version guessed
    wrong, and the char's signedness is retried on OverflowError."""
    if len(data) != ID_BYTES:
        raise CollectiveError(f"the NCCL unique id in the store has {len(data)} bytes, not "
                              f"{ID_BYTES}: is rank 0 running another CuPy/NCCL?")

    def as_tuple():
        signed = char_is_signed()
        try:
            return nccl.NcclCommunicator(world_size, decode_unique_id(data, False, signed), rank)
        except OverflowError:    # the C char of this CuPy build has the other signedness
            return nccl.NcclCommunicator(world_size, decode_unique_id(data, False, not signed),
                                         rank)

    def as_bytes():
        return nccl.NcclCommunicator(world_size, decode_unique_id(data, True), rank)

    first, second = (as_bytes, as_tuple) if cupy_major(cupy) >= 14 else (as_tuple, as_bytes)
    try:
        return first()
    except TypeError as exc:
        if not _wrong_id_type(exc):
            raise
    return second()


# --- NCCL statuses CuPy cannot name ------------------------------------------------------
# CuPy's NcclError looks its status up in a table that stops at 6 (ncclRemoteError), so newer
# statuses raise KeyError(status) from inside NcclError's constructor.
NCCL_STATUS = {7: "ncclInProgress: the communicator is non-blocking (NCCL_COMM_BLOCKING=0?)",
               8: "ncclTimeout: NCCL's own timeout expired (NCCL >= 2.30)"}


def describe(exc: BaseException) -> str:
    """An exception from a CuPy NCCL call, as one line; a KeyError(int) is a status CuPy's
    NcclError could not name."""
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], int):
        status = exc.args[0]
        return (f"NCCL returned status {status} "
                f"({NCCL_STATUS.get(status, 'unknown to this fluidctl')}), which CuPy's "
                "NcclError cannot name")
    return str(exc) or type(exc).__name__


# --- dtypes -------------------------------------------------------------------------------
_NCCL_TYPE = {"e": "NCCL_FLOAT16", "f": "NCCL_FLOAT32", "d": "NCCL_FLOAT64", "b": "NCCL_INT8",
              "B": "NCCL_UINT8", "i": "NCCL_INT32", "I": "NCCL_UINT32", "l": "NCCL_INT64",
              "L": "NCCL_UINT64", "q": "NCCL_INT64", "Q": "NCCL_UINT64"}


def dtype_code(dtype) -> int:
    """The metadata code of a CuPy array's dtype (negative for what NCCL cannot carry)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return meta.BFLOAT16
    if dtype.char in _NCCL_TYPE and dtype.isnative and (dtype.char not in "lL"
                                                        or dtype.itemsize == 8):
        return ord(dtype.char)
    return -(meta.GPU_UNSUPPORTED + ord(dtype.char))


def nccl_type(nccl, dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return nccl.NCCL_BFLOAT16
    return getattr(nccl, _NCCL_TYPE[dtype.char])


# --- set-up -------------------------------------------------------------------------------
def _probe(gpu: int, need_nccl: bool):
    """(status, detail, cupy module or None): what this rank can do, without waiting for
    anyone."""
    try:
        import cupy
    except ImportError:
        return "nocupy", "CuPy is not installed", None
    try:
        cupy.cuda.Device(gpu).use()
    except Exception as exc:                     # CUDARuntimeError and friends
        return "error", f"cannot use GPU {gpu} ({exc})", cupy
    if need_nccl and os.environ.get("NCCL_COMM_BLOCKING", "").strip() == "0":
        return "error", ("NCCL_COMM_BLOCKING=0 asks for non-blocking NCCL communicators, which "
                         "CuPy cannot drive (its calls would return ncclInProgress): unset "
                         "NCCL_COMM_BLOCKING"), cupy
    if need_nccl:
        from cupy.cuda import nccl
        if not getattr(nccl, "available", False):
            from fluidctl.runtime.gpuinstall import cuda_major_of, nccl_hint
            return "error", (f"CuPy {cupy.__version__} cannot load NCCL "
                             f"({nccl_hint(cuda_major_of(cupy))})"), cupy
    return "ok", f"CuPy {cupy.__version__}", cupy


def _place(cupy, gpu: int) -> dict:
    """Where this rank's GPU is, as NCCL compares ranks at init (host, PCI bus id), and the
    NCCL version and opt-in that decide whether two ranks may share it."""
    import socket
    try:
        bus = str(cupy.cuda.Device(gpu).pci_bus_id).lower()
    except Exception:
        bus = ""
    try:
        from cupy.cuda import nccl
        version = int(nccl.get_version())
    except Exception:
        version = 0
    from fluidctl import envs
    return {"host": socket.gethostname(), "bus": bus, "nccl": version,
            "opt_in": envs.shared_gpu_allowed(os.environ)}


def _shared_gpu(table: List[dict]) -> Optional[str]:
    """Two ranks on one physical GPU (same host and PCI bus id): NCCL <= 2.29 refuses it at
    init ("Duplicate GPU detected"), NCCL >= 2.30 unless NCCL_MULTI_RANK_GPU_ENABLE=1. The
    message names the opt-in, or why it does not help here."""
    seen = {}
    for r, t in enumerate(table):
        if not t.get("bus"):
            continue
        key = (t.get("host"), t["bus"])
        if key in seen and not (t.get("opt_in") and t.get("nccl", 0) >= 23000):
            from fluidctl.runtime.gpuinstall import nccl_version_text
            version = nccl_version_text(t.get("nccl", 0))
            how = (f"NCCL {version} here allows it only from 2.30, with "
                   "NCCL_MULTI_RANK_GPU_ENABLE=1" if t.get("opt_in") else
                   "with NCCL >= 2.30 set NCCL_MULTI_RANK_GPU_ENABLE=1")
            return (f"ranks {seen[key]} and {r} are on one GPU (PCI {t['bus']} of {key[0]}), "
                    "which NCCL refuses (\"Duplicate GPU detected\"): give each rank its own "
                    f"GPU, or {how}")
        seen.setdefault(key, r)
    return None


def _verdict(table: List[dict]) -> Optional[str]:
    """None if every rank may use NCCL, 'cpu' if none has CuPy, else the error message."""
    states = [t["status"] for t in table]
    if all(s == "ok" for s in states):
        return _shared_gpu(table)
    if all(s == "nocupy" for s in states):
        return "cpu"
    bad = [f"rank {r}: {t['detail']}" for r, t in enumerate(table) if t["status"] != "ok"]
    if len(bad) > MAX_NAMED_RANKS:
        bad[MAX_NAMED_RANKS:] = [f"and {len(bad) - MAX_NAMED_RANKS} more ranks"]
    return ("GPU set-up failed, so no rank starts NCCL: " + "; ".join(bad) +
            " (every GPU rank needs CuPy with NCCL and a usable device: "
            "pip install 'fluidctl[gpu]')")


PROBE_CHUNK = 256          # probes rank 0 reads per request (a request stays small)
VERDICT_KEY = "gpu/verdict"


def _agree(store, rank: int, world: int, probe: dict, timeout: float) -> Optional[str]:
    """Every rank posts its probe; rank 0 alone reads them (in bounded chunks), judges once
    and posts the verdict, which every other rank reads: O(N) in all, not N x N."""
    import msgpack
    from fluidctl.runtime.store import StoreTimeout
    store.set(f"gpu/probe/{rank}", msgpack.packb(probe))
    if rank != 0:
        posted = msgpack.unpackb(store.get(VERDICT_KEY, timeout + 10.0))   # rank 0 judges first
        if "timeout" in posted:
            raise StoreTimeout(posted["timeout"], posted["missing"])
        return posted["verdict"]
    table = []
    try:
        for lo in range(0, world, PROBE_CHUNK):
            table += [msgpack.unpackb(v) for v in store.multi_get(
                [f"gpu/probe/{r}" for r in range(lo, min(world, lo + PROBE_CHUNK))], timeout)]
    except StoreTimeout as exc:
        store.set(VERDICT_KEY, msgpack.packb({"timeout": str(exc), "missing": exc.missing}))
        raise
    verdict = _verdict(table)
    store.set(VERDICT_KEY, msgpack.packb({"verdict": verdict}))
    return verdict


def setup(ctx, gpu: int):
    """Bring a GPU rank up (see the module docstring). Returns the NcclTransport, or None when
    the job runs on CPU because no rank has CuPy."""
    store, rank, world = ctx.store, ctx.rank, ctx.world_size
    status, detail, cupy = _probe(gpu, need_nccl=True)
    probe = {"status": status, "detail": detail,
             **(_place(cupy, gpu) if status == "ok" and store is not None else {})}
    verdict = _verdict([probe]) if store is None else _agree(store, rank, world, probe,
                                                             ctx.timeout)
    if verdict == "cpu":
        return None
    if verdict:
        raise CollectiveError(verdict)
    from cupy.cuda import nccl
    return NcclTransport(ctx, cupy, nccl, gpu)


class NcclTransport:
    def __init__(self, ctx, cupy, nccl, device: int):
        self.cupy, self.nccl = cupy, nccl
        self.ctx, self.store = ctx, ctx.store
        self.rank, self.n, self.timeout = ctx.rank, ctx.world_size, ctx.timeout
        self.device = device
        self.broken = False
        self.comm = None
        self._peers = self._local_peers()
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            # two events for every collective, re-recorded each time (a wait captures the
            # event's state when it is queued); no timing: cheaper to record and to wait on
            self._ready = cupy.cuda.Event(disable_timing=True)
            self._done = cupy.cuda.Event(disable_timing=True)
        self._create()

    # --- set-up -------------------------------------------------------------------------
    def _local_peers(self):
        """(rank, pid) of the other ranks on this node, to name the one that died."""
        if self.store is None:
            return []
        from fluidctl.runtime.collective.bootstrap import join_layout
        try:
            view = join_layout(self.store, self.n, self.rank, 5.0)
        except Exception:
            return []
        from fluidctl.runtime.collective.shm import _pid_alive
        # only pids this process can see (ranks in another pid namespace are not watched)
        return [(r, pid) for r, pid in view.pids.items()
                if r != self.rank and _pid_alive(pid)]

    def _create(self) -> None:
        nccl, store = self.nccl, self.store
        if store is None:
            data = encode_unique_id(nccl.get_unique_id())
        else:
            if self.rank == 0:
                store.set(ID_KEY, encode_unique_id(nccl.get_unique_id()))
            data = store.get(ID_KEY, self.timeout)
        box = {}

        def create():
            try:
                self.cupy.cuda.Device(self.device).use()     # the device is per thread
                box["comm"] = make_communicator(nccl, self.cupy, self.n, self.rank, data)
            except BaseException as exc:                     # reported below, on every rank
                box["error"] = (describe(exc) if isinstance(exc, KeyError)
                                else f"{type(exc).__name__}: {exc}")

        worker = threading.Thread(target=create, daemon=True, name="fluidctl-nccl-init")
        worker.start()
        if store is None:
            worker.join(self.timeout)
            if "error" in box or "comm" not in box:
                raise CollectiveError(self._init_message({0: box.get("error", "timed out")}))
            self.comm = box["comm"]
            return
        self._wait_init(worker, box)

    def _wait_init(self, worker: threading.Thread, box: dict) -> None:
        """Wait for every rank's communicator, or the first error, on the server: the worker
        thread reports this rank's outcome over the store connection, while this thread parks
        a wait for INIT_ALL or INIT_ERROR on a second connection (one request per slice, which
        the server answers the moment either key appears); between slices it checks the node's
        other ranks' pids and the deadline."""
        from fluidctl.runtime.collective.shm import _pid_alive
        from fluidctl.runtime.store import StoreClient
        deadline = time.monotonic() + self.timeout
        store = self.store

        def report():
            worker.join()
            try:
                if "error" in box:
                    self._post_init_error({self.rank: box["error"]})
                elif store.add(INIT_DONE, 1) == self.n:
                    store.set(INIT_ALL, b"1")
                self._arrive(INIT_REPORTED)
            except (OSError, TimeoutError):
                pass                               # the waiting thread sees the store's end

        reporter = threading.Thread(target=report, daemon=True, name="fluidctl-nccl-report")
        reporter.start()
        waiter = StoreClient(store.endpoint, self.ctx.env.token, self.timeout, rank=self.rank)
        try:
            while True:
                left = deadline - time.monotonic()
                got = waiter.wait_any([INIT_ERROR, INIT_ALL], max(0.0, min(INIT_SLICE, left)))
                posted = got[INIT_ERROR].decode() if INIT_ERROR in got else None
                for r, pid in self._peers:      # a same-node rank that died: tell every rank
                    if posted is None and not _pid_alive(pid):
                        posted = self._post_init_error({r: f"its process (pid {pid}, same node "
                                                           f"as rank {self.rank}) died"})
                if posted is None and INIT_ALL not in got and time.monotonic() >= deadline:
                    missing, total = store.absent(INIT_REPORTED, self.n)
                    named = ", ".join(map(str, missing)) + (
                        f" and {total - len(missing)} more" if total > len(missing) else "")
                    posted = self._post_message(
                        f"creating the NCCL communicator did not finish within {self.timeout:g}s: "
                        f"rank(s) {named or '?'} still in ncclCommInitRank "
                        "(a rank did not start, or NCCL cannot connect the nodes: set "
                        "NCCL_DEBUG=INFO and NCCL_SOCKET_IFNAME)")
                if posted is not None:
                    if "comm" in box:
                        box["comm"].abort()
                    raise CollectiveError(posted)
                if INIT_ALL in got:
                    reporter.join(self.timeout)    # INIT_ALL: every worker has reported
                    self.comm = box["comm"]
                    return
        finally:
            waiter.close()

    def _arrive(self, name: str) -> None:
        """Count this rank in at ``name`` without waiting for the others."""
        from fluidctl.runtime.store import StoreTimeout
        try:
            self.store.barrier(name, self.n, 0)
        except StoreTimeout:
            pass

    def _post_init_error(self, errors) -> str:
        return self._post_message(self._init_message(errors))

    def _post_message(self, message: str) -> str:
        """The first rank's message wins, so every rank raises the same one."""
        if self.store.add(INIT_ERROR + "/count", 1) == 1:
            self.store.set(INIT_ERROR, message.encode())
        return self.store.get(INIT_ERROR, 5.0).decode()

    def _init_message(self, errors) -> str:
        what = "; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        return (f"creating the NCCL communicator failed ({what}); check the GPU driver "
                "(nvidia-smi) and NCCL (NCCL_DEBUG=INFO)")

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            if self.broken:
                comm.abort()
            else:
                comm.destroy()

    # --- collectives --------------------------------------------------------------------
    def _problem(self, x) -> int:
        if not x.flags.c_contiguous:
            return meta.NOT_CONTIGUOUS
        if x.device.id != self.device:
            return meta.WRONG_DEVICE
        return 0

    def run(self, kind: str, x, op: str = "sum", root: int = 0):
        if self.broken:
            raise CollectiveError("the NCCL communicator is broken by an earlier error; "
                                  "restart the job (fluidctl train --max-restarts)")
        problem = self._problem(x)
        code = problem or dtype_code(x.dtype)
        rec = meta.record(0, kind, op, np.uint8, x.shape, root, 0)
        rec[meta.DTYPE] = code
        if code < 0 and not problem:
            meta.pack_name(rec, x.dtype)          # the others name what they cannot see
        rec[meta.NBYTES] = int(x.nbytes)
        self.ctx.comm.agree(rec)                 # same CollectiveError everywhere on mismatch
        seq = int(rec[meta.SEQ])
        if kind == "reduce_scatter" and (x.ndim == 0 or x.shape[0] % self.n):
            raise CollectiveError(f"reduce_scatter: shape {x.shape} cannot be split in "
                                  f"{self.n} along its first dimension")
        if kind == "barrier":
            return x
        cp, nccl = self.cupy, self.nccl
        with cp.cuda.Device(self.device):
            caller = cp.cuda.get_current_stream()
            runtime_error = cp.cuda.runtime.CUDARuntimeError
            try:             # after a sticky fault every CUDA call raises its error
                self._ready.record(caller)
                self.stream.wait_event(self._ready)
                out = self._launch(kind, x, op, root)
                done = self._done
                done.record(self.stream)
                caller.wait_event(done)
            except runtime_error as exc:
                self._fail(self._fault_message(kind, seq, str(exc)))
            self._wait(done, seq, kind)
            if op == "mean" and (kind != "reduce" or self.rank == root):
                target = out if out is not None else x
                target /= target.dtype.type(self.n)
        return out if out is not None else x

    def _launch(self, kind, x, op, root):
        cp, nccl = self.cupy, self.nccl
        dt, count, ptr, s = nccl_type(nccl, x.dtype), x.size, x.data.ptr, self.stream.ptr
        red = {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "max": nccl.NCCL_MAX,
               "min": nccl.NCCL_MIN}[op]
        try:
            if kind == "allreduce":
                self.comm.allReduce(ptr, ptr, count, dt, red, s)
            elif kind == "reduce":
                self.comm.reduce(ptr, ptr, count, dt, red, root, s)
            elif kind == "broadcast":
                self.comm.broadcast(ptr, ptr, count, dt, root, s)
            elif kind == "allgather":
                with self.stream:
                    out = cp.empty((self.n,) + tuple(x.shape), dtype=x.dtype)
                self.comm.allGather(ptr, out.data.ptr, count, dt, s)
                return out
            elif kind == "reduce_scatter":
                with self.stream:
                    out = cp.empty((x.shape[0] // self.n,) + tuple(x.shape[1:]), dtype=x.dtype)
                self.comm.reduceScatter(ptr, out.data.ptr, out.size, dt, red, s)
                return out
        except self.cupy.cuda.runtime.CUDARuntimeError:
            raise                                # a CUDA fault: named by run()
        except Exception as exc:                 # NcclError raised at launch on this rank
            self._fail(f"NCCL {kind} failed on rank {self.rank}: {describe(exc)}")
        return None

    def _wait(self, done, seq: int, kind: str) -> None:
        """The one host wait of a collective: its completion event, to the deadline. Polls
        the event (cudaEventQuery, ~1 us) yielding the CPU for the first 10 ms, so a short
        collective is not slowed by the polling; NCCL's async error and the deadline are
        looked at every millisecond, same-node peers' processes every 0.2 s (NCCL never
        reports a same-node death: P2P/SHM post no proxy work, so the call would hang to the
        deadline), errors other ranks posted every half second."""
        if self._finished(done, seq, kind):
            return
        start = time.monotonic()
        deadline, spin_until = start + self.timeout, start + 0.01
        next_check, next_look, next_peers = start, start + 0.5, start + 0.2
        while not self._finished(done, seq, kind):
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1e-3
                try:
                    self.comm.check_async_error()
                except Exception as exc:
                    self._fail(f"NCCL {kind} (collective #{seq}) failed on rank {self.rank}: "
                               f"{describe(exc)}")
                if now > next_peers:
                    next_peers = now + 0.2
                    if self._dead_peers():
                        self._fail(f"NCCL {kind} (collective #{seq}) cannot finish")
                if now > deadline:
                    self._fail(f"NCCL {kind} (collective #{seq}) did not finish within "
                               f"{self.timeout:g}s on rank {self.rank}")
                if now > next_look:
                    next_look = now + 0.5
                    posted = self._posted()
                    if posted:
                        self._fail(posted, post=False)
            time.sleep(0 if now < spin_until else 5e-4)

    def _finished(self, event, seq: int, kind: str) -> bool:
        """cudaEventQuery: 0 done, cudaErrorNotReady (600) not yet, anything else a CUDA
        fault (``Event.done`` is False for both, so a sticky fault would spin to the
        deadline): a fault ends the collective now, named."""
        runtime = self.cupy.cuda.runtime
        status = runtime.eventQuery(event.ptr)
        if status == 0:
            return True
        if status == CUDA_NOT_READY:
            return False
        try:
            what = str(runtime.CUDARuntimeError(status))
        except Exception:
            what = f"CUDA error {status}"
        self._fail(self._fault_message(kind, seq, what))
        return False

    def _fault_message(self, kind: str, seq: int, what: str) -> str:
        return (f"NCCL {kind} (collective #{seq}) on rank {self.rank}: CUDA fault on GPU "
                f"{self.device}: {what} (a kernel of this process failed; the CUDA context "
                "is unusable: restart, and find the kernel with CUDA_LAUNCH_BLOCKING=1 or "
                "compute-sanitizer)")

    def _posted(self) -> Optional[str]:
        if self.store is None:
            return None
        from fluidctl.runtime.store import StoreTimeout
        try:
            return self.store.get(ERROR_KEY, 0).decode()
        except StoreTimeout:
            return None
        except OSError as exc:
            return f"lost the rendezvous store on rank 0 during an NCCL collective ({exc})"

    def _dead_peers(self) -> List[str]:
        from fluidctl.runtime.collective.shm import _pid_alive
        return [f"rank {r} (pid {pid}, same node) died" for r, pid in self._peers
                if not _pid_alive(pid)]

    def _fail(self, message: str, post: bool = True):
        """Abort the communicator and raise the job's first error, the same on every rank."""
        dead = self._dead_peers() if post else []
        if dead:
            message = f"{'; '.join(dead)}: {message}"
        if post and self.store is not None:
            try:
                if self.store.add(ERROR_KEY + "/count", 1) == 1:
                    self.store.set(ERROR_KEY, message.encode())
                message = self.store.get(ERROR_KEY, 5.0).decode()
            except Exception:
                pass
        self.broken = True
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception as exc:
                print(f"fluidctl: rank {self.rank}: ncclCommAbort: {exc}", file=sys.stderr)
        raise CollectiveError(message + " (the communicator is aborted; restart the job)")
