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

Each collective (``run``): agrees on its metadata over the CPU communicator (in full on a
signature's first use, then by a rolling hash: agree.py), launches NCCL on the caller's current
stream, records one pooled completion event and returns; gpuwork.py's watchdog retires the
work and turns a fault, NCCL's async error, a dead same-node peer or the deadline into the same
CollectiveError on every rank (the communicator aborted).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import List, Optional

import numpy as np

from fluidctl.runtime.collective import meta, posted
from fluidctl.runtime.collective.agree import signature
from fluidctl.runtime.collective.gpuwork import DEPTH, InFlight
from fluidctl.runtime.collective.meta import CollectiveError
from fluidctl.runtime.collective.ncclcodes import (  # noqa: F401 (nccl's API)
    ID_BYTES, NCCL_STATUS, _NCCL_OPS, _NCCL_TYPE, _wrong_id_type, char_is_signed, cupy_major,
    decode_unique_id, describe, dtype_code, encode_unique_id, make_communicator, nccl_type)

ID_KEY = "nccl/unique_id"
INIT_ERROR = "nccl/init/error"        # the first error creating the communicator (all raise it)
INIT_DONE = "nccl/init/done"          # a counter of ranks whose communicator is up
INIT_ALL = "nccl/init/all"            # set by the last of them
INIT_REPORTED = "nccl/init/reported"  # a barrier each rank arrives at once its init ended
MAX_NAMED_RANKS = 16                  # ranks named one by one in a set-up error
INIT_SLICE = 0.5                      # seconds a parked wait lasts between pid/deadline checks


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
        self._tripping = threading.Lock()   # one trip per rank (see trip)
        self.comm = None
        self._peers = self._local_peers()
        self._runtime_error = cupy.cuda.runtime.CUDARuntimeError
        self._entries = {}            # signature -> what run() needs (see _entry)
        self._group = None            # the calls of an open coalesced() block
        from fluidctl import envs
        depth = os.environ.get(envs.GPU_INFLIGHT, "").strip()
        self.work = InFlight(self, int(depth) if depth.isdigit() else DEPTH)
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
        self.work.close()
        comm, self.comm = self.comm, None
        if comm is not None:
            if self.broken:
                comm.abort()
            else:
                comm.destroy()

    # --- collectives --------------------------------------------------------------------
    def _problem(self, x) -> int:
        """Why run() cannot use ``x``: not contiguous, else on another device."""
        return meta.NOT_CONTIGUOUS if not x.flags.c_contiguous else meta.WRONG_DEVICE

    def _entry(self, kind, x, op, root, problem):
        """What a call's signature needs, built once: (record, signature hash, NCCL dtype, NCCL
        op, divide by the world size, error to raise after agreeing)."""
        code = problem or dtype_code(x.dtype)
        rec = meta.record(0, kind, op, np.uint8, x.shape, root, 0)
        rec[meta.DTYPE] = code
        if code < 0 and not problem:
            meta.pack_name(rec, x.dtype)          # the others name what they cannot see
        rec[meta.NBYTES] = int(x.nbytes)
        nccl = self.nccl
        usable = code > 0 and op in _NCCL_OPS
        dt = nccl_type(nccl, x.dtype) if usable else None
        red = getattr(nccl, _NCCL_OPS[op]) if usable else None
        divide = op == "mean" and (kind != "reduce" or self.rank == root)
        error = None
        if kind == "reduce_scatter" and (x.ndim == 0 or x.shape[0] % self.n):
            error = (f"reduce_scatter: shape {x.shape} cannot be split in {self.n} along its "
                     "first dimension")
        return rec, signature(rec), dt, red, divide, error

    def run(self, kind: str, x, op: str = "sum", root: int = 0):
        work = self.work
        key = (kind, op, x.dtype, x.shape, root)
        if x.flags.c_contiguous and x.data.device_id == self.device:
            entry = self._entries.get(key)
            if entry is None:
                if len(self._entries) > 1024:
                    self._entries.clear()
                entry = self._entries[key] = self._entry(kind, x, op, root, 0)
            full = False
        else:                                     # never launched: agreed in full, named
            entry, full = self._entry(kind, x, op, root, self._problem(x)), True
        rec, sig, dt, red, divide, error = entry
        seq = self.ctx.comm.gpu_call(key, rec, sig, full)   # same CollectiveError everywhere
        if work.fault is not None or self.broken:   # agreed first: the others' checks meet it
            self._raise_broken()
        if error is not None:
            raise CollectiveError(error)
        cp = self.cupy
        runtime = cp.cuda.runtime
        before = runtime.getDevice()
        if before != self.device:                # the device is per thread: switch only if needed
            runtime.setDevice(self.device)
        try:
            stream = cp.cuda.get_current_stream()
            try:             # after a sticky fault every CUDA call raises its error
                out = self._launch(kind, x, dt, red, root, stream.ptr)
                if self._group is not None:
                    self._group.append((seq, kind, out if out is not None else x, divide))
                    return out if out is not None else x
                if divide:
                    target = out if out is not None else x
                    target /= target.dtype.type(self.n)
                if stream.ptr and stream.is_capturing():
                    # a CUDA graph's capture: checked now, at capture time; nothing to watch
                    # (an event recorded in a capture cannot be queried), as torch does
                    return out if out is not None else x
                event = work.event()
                event.record(stream)
            except self._runtime_error as exc:
                self._fail(self._fault_message(kind, seq, str(exc)))
            work.push(event, seq, kind)
        finally:
            if before != self.device:
                runtime.setDevice(before)
        return out if out is not None else x

    def _launch(self, kind, x, dt, red, root, s):
        comm = self.comm
        if comm is None:
            self._raise_broken()
        ptr, count = x.data.ptr, x.size
        try:
            if kind == "allreduce":
                comm.allReduce(ptr, ptr, count, dt, red, s)
            elif kind == "reduce":
                comm.reduce(ptr, ptr, count, dt, red, root, s)
            elif kind == "broadcast":
                comm.broadcast(ptr, ptr, count, dt, root, s)
            elif kind == "allgather":
                out = self.cupy.empty((self.n,) + tuple(x.shape), dtype=x.dtype)
                comm.allGather(ptr, out.data.ptr, count, dt, s)
                return out
            elif kind == "reduce_scatter":
                out = self.cupy.empty((x.shape[0] // self.n,) + tuple(x.shape[1:]),
                                      dtype=x.dtype)
                comm.reduceScatter(ptr, out.data.ptr, out.size, dt, red, s)
                return out
        except self._runtime_error:
            raise                                # a CUDA fault: named by run()
        except Exception as exc:                 # NcclError raised at launch on this rank
            self._fail(f"NCCL {kind} failed on rank {self.rank}: {describe(exc)}")
        return None

    @contextlib.contextmanager
    def coalesced(self):
        """The collectives inside are one NCCL group (groupStart/groupEnd) and one completion
        event; divisions for op='mean' are queued after the group."""
        if self._group is not None:              # nested: the outer group holds them
            yield
            return
        self.nccl.groupStart()
        self._group = []
        try:
            yield
        finally:
            group, self._group = self._group, None
            self.nccl.groupEnd()
        if group:
            self._end_group(group)

    def _end_group(self, group) -> None:
        cp = self.cupy
        with cp.cuda.Device(self.device):
            stream = cp.cuda.get_current_stream()
            try:
                for _, _, target, divide in group:
                    if divide:
                        target /= target.dtype.type(self.n)
                if stream.ptr and stream.is_capturing():
                    return                       # captured in a CUDA graph: nothing to watch
                event = self.work.event()
                event.record(stream)
            except self._runtime_error as exc:
                self._fail(self._fault_message("group", group[-1][0], str(exc)))
        seq, kind = group[-1][0], f"group of {len(group)} collectives ending with {group[-1][1]}"
        self.work.push(event, seq, kind)

    def synchronize(self) -> None:
        """Wait (bounded by the watchdog) until every queued collective finished; raise the
        sticky fault if one failed."""
        if self.broken or self.work.fault is not None:
            self._raise_broken()
        self.work.wait(0)

    def _raise_broken(self):
        raise CollectiveError(self.work.fault or
                              "the NCCL communicator is broken by an earlier error; restart the "
                              "job (fluidctl train --max-restarts)")

    def adopt_posted(self) -> str:
        """Another rank's GPU work failed (a hash comparison said so): take the job's first
        error, abort, and return it."""
        if self.work.fault is not None:
            return self.work.fault
        return self.trip(self._posted() or "another rank's GPU collective failed", post=False)

    def _status_text(self, status: int) -> str:
        try:
            return str(self._runtime_error(status))
        except Exception:
            return f"CUDA error {status}"

    def _async_error(self, kind: str, seq: int) -> Optional[str]:
        comm = self.comm
        if comm is None:
            return None
        try:
            comm.check_async_error()
        except Exception as exc:
            return (f"NCCL {kind} (collective #{seq}) failed on rank {self.rank}: "
                    f"{describe(exc)}")
        return None

    def _fault_message(self, kind: str, seq: int, what: str) -> str:
        return (f"NCCL {kind} (collective #{seq}) on rank {self.rank}: CUDA fault on GPU "
                f"{self.device}: {what} (a kernel of this process failed; the CUDA context "
                "is unusable: restart, and find the kernel with CUDA_LAUNCH_BLOCKING=1 or "
                "compute-sanitizer)")

    def _posted(self) -> Optional[str]:
        return posted.read(self.store, "lost the rendezvous store on rank 0 during an NCCL "
                                       "collective ({})")

    def _dead_peers(self) -> List[str]:
        from fluidctl.runtime.collective.shm import _pid_alive
        return [f"rank {r} (pid {pid}, same node) died" for r, pid in self._peers
                if not _pid_alive(pid)]

    def trip(self, message: str, post: bool = True) -> str:
        """Make ``message`` the job's error (the first rank's wins, so every rank raises the
        same one), abort the communicator and set the sticky fault. Any thread: the caller's
        and the watchdog often see one death at once, and one trip each would post twice and
        wait on the store for each other (the store client serves one request at a time), each
        rank then raising its own words. So one trips, and the other raises its result."""
        with self._tripping:
            if self.work.fault is not None:
                return self.work.fault
            return self._trip(message, post)

    def _trip(self, message: str, post: bool) -> str:
        dead = self._dead_peers() if post else []
        if dead:
            message = f"{'; '.join(dead)}: {message}"
        if post:
            message = posted.post(self.store, message)
        message = self.work.trip(message + " (the communicator is aborted; restart the job)")
        self.broken = True
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception as exc:
                print(f"fluidctl: rank {self.rank}: ncclCommAbort: {exc}", file=sys.stderr)
        return message

    def first_error(self, message: str, post: bool = True) -> str:
        """The job's first error, the same on every rank: this rank's sticky fault if it has
        one, else ``message`` tripped (posted, the communicator aborted)."""
        return self.trip(message, post)        # trip keeps a sticky fault as it is

    def _fail(self, message: str, post: bool = True):
        """Abort the communicator and raise the job's first error, the same on every rank."""
        raise CollectiveError(self.first_error(message, post))
