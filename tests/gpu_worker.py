"""GPU scenarios for tests/test_runtime_gpu.py (the CuPy/NCCL double) and tests/gpu (a real
GPU): ``python tests/gpu_worker.py SCENARIO``; each rank prints one RESULT line of JSON."""
import json
import os
import sys
import threading
import time

import numpy as np

import fluidctl.runtime as rt
from fluidctl.runtime import CollectiveError

TIMEOUT = float(os.environ.get("FLUIDCTL_TIMEOUT", "60"))


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def outcome(call, *, timed=False, exit_on_error=True):
    """Run ``call`` (collectives) and report ``error``: None, or the CollectiveError's text
    (with the seconds it took when ``timed``), then exit 1 unless told not to."""
    start = time.monotonic()
    try:
        call()
        result(error=None)
    except CollectiveError as exc:
        result(error=str(exc), **({"seconds": time.monotonic() - start} if timed else {}))
        if exit_on_error:
            sys.exit(1)


def queued_then_synchronize(ctx, x):
    """A GPU collective returns once queued; its failure comes at the next call or here."""
    ctx.allreduce(x)
    ctx.synchronize()


def dtypes():
    out = ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64",
           "uint64"]
    try:
        import ml_dtypes
        out.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return out


def inputs(rank, dtype, shape=(4, 3)):
    """Small per-rank values every dtype holds exactly (sums of a few ranks too)."""
    base = (np.arange(np.prod(shape)).reshape(shape) % 5) + 1
    return (base * (rank + 1)).astype(dtype)


def check_ops(ctx, cp, errors):
    n, r = ctx.world_size, ctx.rank
    for dt in dtypes():
        name = np.dtype(dt).name
        per = [inputs(k, dt) for k in range(n)]
        wide = [p.astype(np.float64) for p in per]
        cases = [("allreduce", "sum", sum(wide)), ("allreduce", "max", np.maximum.reduce(wide)),
                 ("allreduce", "min", np.minimum.reduce(wide))]
        if np.dtype(dt).kind == "f" or name == "bfloat16":
            cases.append(("allreduce", "mean", sum(wide) / n))
        for kind, op, want in cases:
            x = cp.asarray(per[r])
            got = getattr(ctx, kind)(x, op=op)
            if not np.allclose(got.get().astype(np.float64), want, rtol=1e-2):
                errors.append(f"{kind} {op} {name}: {got.get().tolist()}")
        root = n - 1
        x = cp.asarray(per[r])
        ctx.broadcast(x, root=root)
        if not np.array_equal(x.get().astype(np.float64), wide[root]):
            errors.append(f"broadcast {name}")
        for op, want in (("sum", sum(wide)), ("mean", sum(wide) / n)):
            if op == "mean" and not (np.dtype(dt).kind == "f" or name == "bfloat16"):
                continue
            x = cp.asarray(per[r])
            ctx.reduce(x, root=root, op=op)
            expect = want if r == root else wide[r]       # non-roots keep their input
            if not np.allclose(x.get().astype(np.float64), expect, rtol=1e-2):
                errors.append(f"reduce {op} {name} on rank {r}: {x.get().tolist()}")
        g = ctx.allgather(cp.asarray(per[r]))
        if g.shape != (n, 4, 3) or not np.array_equal(g.get().astype(np.float64),
                                                      np.stack(wide)):
            errors.append(f"allgather {name}")
        big = cp.asarray(np.concatenate([inputs(r, dt)] * n))   # (4n, 3)
        part = ctx.reduce_scatter(big)
        want = sum(np.concatenate([inputs(k, dt)] * n).astype(np.float64) for k in range(n))
        if not np.array_equal(part.get().astype(np.float64), want[r * 4:(r + 1) * 4]):
            errors.append(f"reduce_scatter {name}")


def ops(ctx):
    import cupy as cp
    errors = []
    check_ops(ctx, cp, errors)
    result(errors=errors, device=ctx.device, device_id=ctx.device_id)


def reduce_mean(ctx):
    """reduce(op='mean') to the last rank: root gets the mean, the others keep their input."""
    import cupy as cp
    root = ctx.world_size - 1
    x = cp.asarray(inputs(ctx.rank, "float32"))
    ctx.reduce(x, root=root, op="mean")
    result(x=x.get().tolist(), root=root)


def thread_stream(ctx):
    """A collective from another thread (whose current device is its own, 0) on arrays of the
    rank's device, and one inside a non-blocking stream of the rank's device."""
    import cupy as cp
    errors = []
    x = cp.asarray(inputs(ctx.rank, "float32"))     # made in the thread that called init()
    want = sum(inputs(k, "float32") for k in range(ctx.world_size))

    def other():
        try:
            ctx.allreduce(x)
            if cp.cuda.Device().id != 0:
                errors.append("the collective changed the calling thread's device")
            with cp.cuda.Device(ctx.device_id):
                s = cp.cuda.Stream(non_blocking=True)
                with s:                              # produced and consumed on that stream
                    y = cp.asarray(inputs(ctx.rank, "float32")) * 1
                    ctx.allreduce(y)
                    z = y + 0
                s.synchronize()        # z was made on s, a non-blocking stream
            if not np.array_equal(x.get(), want) or not np.array_equal(z.get(), want):
                errors.append("thread/stream allreduce gave wrong numbers")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    t = threading.Thread(target=other)
    t.start()
    t.join()
    result(errors=errors)


def stream_order(ctx):
    """Two collectives on two streams while the first stream is still busy on rank 1: NCCL
    runs one communicator's kernels in the order they were issued, whatever their streams
    (enqueue.cc: the launch stream waits on the communicator's deviceStream), so both finish
    with the right numbers on every rank. (Double only: the busy stream is a gated kernel.)"""
    import cupy as cp
    from cupy import _double
    want = sum(inputs(k, "float32") for k in range(ctx.world_size))
    gate = threading.Event()
    with cp.cuda.Device(ctx.device_id):
        a, b = cp.cuda.Stream(), cp.cuda.Stream()
        with a:
            x = cp.asarray(inputs(ctx.rank, "float32"))
        with b:
            y = cp.asarray(inputs(ctx.rank, "float32"))
        if ctx.rank == 1:
            a._enqueue_async(gate.wait)          # a long kernel still running on stream a
        with a:
            ctx.allreduce(x)
        with b:
            ctx.allreduce(y)
        threading.Timer(0.3, gate.set).start()   # the kernel ends later, on its own
        ctx.synchronize()
        right = np.array_equal(x.get(stream=a), want) and np.array_equal(y.get(stream=b), want)
    assert _double is not None
    result(errors=[] if right else ["cross-stream allreduces gave wrong numbers"])


def graph_capture(ctx):
    """An allreduce captured in a CUDA graph (stream capture), the graph launched 3 times: the
    agreement runs once, at capture time; nothing is queried or waited on during the capture
    (illegal there: it would end it) and each launch really reduces."""
    import cupy as cp
    base = inputs(ctx.rank, "float32") / (ctx.rank + 1)
    world = sum(range(1, ctx.world_size + 1))
    errors = []
    with cp.cuda.Device(ctx.device_id):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.asarray(inputs(ctx.rank, "float32"))
            s.synchronize()
            s.begin_capture()
            try:
                ctx.allreduce(x)
            finally:
                g = s.end_capture()
            for launch in range(3):
                g.launch(stream=s)
            ctx.synchronize()
            s.synchronize()
            got = x.get(stream=s)
    want = base * world * ctx.world_size ** 2       # sum, then twice the sum of equal values
    if not np.array_equal(got, want):
        errors.append(f"replayed allreduce gave {got.ravel()[:3]}, want {want.ravel()[:3]}")
    ctx.allreduce(np.ones(2))                        # the job goes on after the graph
    result(errors=errors)


def handshake(ctx):
    import cupy
    comm = ctx.comm.nccl.comm if ctx.comm.nccl is not None else None
    result(device=ctx.device, xp=ctx.xp.__name__, cupy=cupy.__version__,
           current_device=cupy.cuda.Device().id,
           nccl_rank=comm.rank_id() if comm is not None else None,
           nccl_size=comm.size() if comm is not None else None,
           nccl_device=comm.device_id() if comm is not None else None)


def host_waits(ctx):
    """How often one allreduce makes the host wait, and on which stream: the double counts
    every wait; on a real GPU CuPy's Python-visible blocking calls are wrapped and counted
    (cudaStream/Event/DeviceSynchronize; a wait inside CuPy's own Cython is not seen)."""
    import cupy as cp
    x = cp.ones(1 << 12, cp.float32)
    ctx.allreduce(x)                                   # warm up
    counter = _host_wait_counter(cp)
    caller = cp.cuda.get_current_stream().ptr
    before = dict(counter["by_stream"]), counter["count"]
    ctx.allreduce(x)
    after = dict(counter["by_stream"]), counter["count"]
    result(total=after[1] - before[1],
           caller=after[0].get(caller, 0) - before[0].get(caller, 0),
           ok=bool((x.get() == ctx.world_size ** 2).all()), hooks=counter.get("hooks", "double"))


def _host_wait_counter(cp) -> dict:
    try:
        from cupy import _double
        return _double.host_waits
    except ImportError:
        pass
    counter = {"count": 0, "by_stream": {}, "hooks": []}

    def count(ptr):
        counter["count"] += 1
        counter["by_stream"][ptr] = counter["by_stream"].get(ptr, 0) + 1

    runtime = cp.cuda.runtime
    for name, ptr_of in (("streamSynchronize", lambda a: a[0]), ("eventSynchronize", lambda a: -1),
                         ("deviceSynchronize", lambda a: cp.cuda.get_current_stream().ptr)):
        real = getattr(runtime, name)

        def wrapped(*a, _real=real, _ptr_of=ptr_of):
            count(_ptr_of(a))
            return _real(*a)
        setattr(runtime, name, wrapped)
        counter["hooks"].append(f"runtime.{name}")
    for cls_name, ptr_of in (("Stream", lambda self: self.ptr), ("Event", lambda self: -1)):
        cls = getattr(cp.cuda, cls_name)
        real = cls.synchronize
        try:
            def sync(self, _real=real, _ptr_of=ptr_of):
                count(_ptr_of(self))
                return _real(self)
            cls.synchronize = sync
            counter["hooks"].append(f"{cls_name}.synchronize")
        except TypeError:                                   # a cdef class: not patchable
            pass
    return counter


def pci(ctx):
    import cupy
    result(device_id=ctx.device_id, pci_bus_id=cupy.cuda.Device(ctx.device_id).pci_bus_id,
           visible=os.environ.get("CUDA_VISIBLE_DEVICES"))


def where(ctx):
    result(device=ctx.device, xp=ctx.xp.__name__)


def host(a):
    return a.get() if hasattr(a, "get") else a


def optimizer(ctx):
    """DistributedOptimizer on ctx.xp parameters (CuPy on GPU ranks; Reduce or AllReduce)."""
    cp = ctx.xp
    strategy = sys.argv[2] if len(sys.argv) > 2 else "AllReduce"
    rng = np.random.default_rng(ctx.rank)
    params = {"w": cp.asarray(rng.standard_normal((8, 3)).astype(np.float32)),
              "b": cp.asarray(np.zeros(3, np.float64))}
    opt = rt.DistributedOptimizer(params, optimizer=rt.optim.Momentum(lr=0.1),
                                  strategy=rt.DistributeStrategy(reduce_strategy=strategy))
    pushed = []                      # completion events queued per step (GPU: the watchdog's)
    work = ctx.comm.nccl.work if ctx.comm.nccl is not None else None
    if work is not None:
        real = work.push
        work.push = lambda *a: (pushed.append(a[1:]), real(*a))
    per_step = []
    for step in range(3):
        grads = {"w": cp.asarray(np.full((8, 3), ctx.rank + step, np.float32)),
                 "b": cp.asarray(np.full(3, 2.0 * ctx.rank, np.float64))}
        before = len(pushed)
        opt.step(grads)
        per_step.append(len(pushed) - before)
    result(w=host(params["w"]).tolist(), b=host(params["b"]).tolist(),
           types=[type(p).__module__.split(".")[0] for p in params.values()],
           events_per_step=per_step)


def bf16_optimizer(ctx):
    import cupy as cp
    import ml_dtypes
    strategy = sys.argv[2]
    params = {"w": cp.asarray(np.ones(4, ml_dtypes.bfloat16))}
    opt = rt.DistributedOptimizer(params, optimizer=rt.optim.SGD(lr=0.5),
                                  strategy=rt.DistributeStrategy(reduce_strategy=strategy))
    opt.step({"w": cp.asarray(np.full(4, ctx.rank + 1.0, ml_dtypes.bfloat16))})
    result(w=host(params["w"]).astype(np.float64).tolist(), dtype=params["w"].dtype.name,
           type=type(params["w"]).__module__.split(".")[0])


def events(ctx):
    """How many CUDA events, with and without timing, 5 collectives (each waited for)
    create once the pool holds one."""
    import cupy as cp
    from cupy import _double
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)                   # the pool grows to what is in flight at most: one
    ctx.synchronize()
    before = dict(_double.events_made)
    for _ in range(5):
        ctx.allreduce(x)
        ctx.synchronize()
    result(**{k: _double.events_made[k] - before[k] for k in before})


def die(ctx):
    """Rank 1 dies; the others are in an allreduce and must get a CollectiveError."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)
    if ctx.rank == 1:
        os.kill(os.getpid(), 9)

    def three():
        for _ in range(3):
            ctx.allreduce(x)
        ctx.synchronize()
    outcome(three, timed=True)


def die_in_kernel(ctx):
    """Rank 1 passes the metadata agreement, then dies inside its NCCL call (it never posts
    its part): NCCL reports nothing for a same-node peer; fluidctl must see it in ~1 s."""
    import cupy as cp
    x = cp.ones(1 << 16, cp.float32)
    ctx.allreduce(x)
    ctx.synchronize()                   # retired: the failure is #2's alone
    if ctx.rank == 1:
        def killed(*args):
            os.kill(os.getpid(), 9)
        ctx.comm.nccl.comm.allReduce = killed
    outcome(lambda: queued_then_synchronize(ctx, x), timed=True)


def cuda_fault(ctx):
    """Rank 1's kernel hits an illegal address inside its NCCL call (the double's sticky
    fault, cudaErrorIllegalAddress): every rank must fail at once, naming the fault."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)
    ctx.synchronize()                   # retired: the failure is #2's alone
    if ctx.rank == 1:
        def faulted(*args):
            from cupy import _double
            _double.fault(700)
        ctx.comm.nccl.comm.allReduce = faulted
    outcome(lambda: queued_then_synchronize(ctx, x), timed=True)


def nccl_status8(ctx):
    """Rank 1's communicator reports ncclTimeout (8), a status CuPy's NcclError cannot name."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)
    ctx.synchronize()                   # retired: the failure is #2's alone
    if ctx.rank == 1:
        comm = ctx.comm.nccl.comm

        def timed_out(send, recv, count, dtype, op, stream):
            comm._error = 8                     # its kernel never ends, until abort()
            cp.cuda.stream_of(stream)._enqueue_async(comm._aborted.wait)
        comm.allReduce = timed_out
    outcome(lambda: queued_then_synchronize(ctx, x), timed=True)


def stuck(ctx):
    """Rank 1 stays alive but never calls: the others' collective ends at the timeout."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    if ctx.rank == 1:
        time.sleep(3 * TIMEOUT)
        return
    outcome(lambda: queued_then_synchronize(ctx, x), timed=True)


def launch_error(ctx):
    """One rank's NCCL call fails at launch (a buffer NCCL refuses): all ranks fail alike."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    if ctx.rank == 1:
        real = ctx.comm.nccl.comm.allReduce

        def bad(send, recv, count, dtype, op, stream):
            return real(send, recv, count, dtype, op, 12345)     # not a stream
        ctx.comm.nccl.comm.allReduce = bad
    outcome(lambda: queued_then_synchronize(ctx, x))


def wrong_device(ctx):
    """An array made on the default device 0 (as before init()) on every rank."""
    import cupy as cp
    with cp.cuda.Device(0):
        x = cp.ones(4, cp.float32)
    outcome(lambda: ctx.allreduce(x), exit_on_error=False)


def bad_dtype(ctx):
    import cupy as cp
    outcome(lambda: ctx.allreduce(cp.ones(4, cp.int16)), exit_on_error=False)


# --- scenarios that change things before init() -----------------------------------------
def _wrap_constructor(before):
    """Run ``before(rank)`` in each rank's NcclCommunicator constructor (ncclCommInitRank)."""
    from cupy.cuda import nccl
    real = nccl.NcclCommunicator

    def make(ndev, commId, rank, *rest):
        before(rank)
        return real(ndev, commId, rank, *rest)
    nccl.NcclCommunicator = make


def _count_store_requests():
    from fluidctl.runtime import store
    real, counts = store.StoreServer._handle, {"n": 0}

    def handle(self, *request):
        counts["n"] += 1
        return real(self, *request)
    store.StoreServer._handle = handle
    return counts


def before_slow_init():
    _wrap_constructor(lambda rank: time.sleep(1.0) if rank == 1 else None)
    return _count_store_requests()


def slow_init(ctx, counts):
    result(requests=counts["n"] if ctx.rank == 0 else None)


def before_init_stuck():
    _wrap_constructor(lambda rank: time.sleep(4 * TIMEOUT) if rank == 1 else None)


# --- queued work, the watchdog and the hash phase (issue 38) ------------------------------
def _arrays(cp, which):
    return {"A": cp.ones(4, cp.float32), "B": cp.ones(6, cp.float32),
            "D": cp.ones(4, cp.float64), "C": cp.ones(5, cp.float32)}[which]


def mismatch(ctx):
    """argv: when (first | hashed), then rank 0's and rank 1's array (A, B, C: shapes 4, 6,
    5 float32; D: 4 float64). 'hashed' first agrees on A and B on both ranks."""
    import cupy as cp
    when, mine = sys.argv[2], sys.argv[3 + ctx.rank]
    # made first: the double orders host-side array work after queued work (drains it)
    arrays = {k: _arrays(cp, k) for k in "ABCD"}

    def calls():
        if when == "hashed":
            for _ in range(3):
                for k in "ABD":
                    ctx.allreduce(arrays[k])
            ctx.synchronize()
        ctx.allreduce(arrays[mine])
        ctx.allreduce(arrays["A"])
        if sys.argv[5:] == ["checkpoint"]:     # found where a checkpoint is agreed
            if ctx.rank == 0:
                with open(os.environ["FLUIDCTL_CHECKPOINT_REQUEST"], "w") as f:
                    f.write("save\n")
            while not ctx.checkpoint_requested():
                pass
            return
        ctx.synchronize()
    outcome(calls, timed=True, exit_on_error=False)
    try:
        ctx.allreduce(arrays["A"])
        result(after=None)
    except CollectiveError as exc:
        result(after=str(exc))
    _leave_together(ctx)


def _leave_together(ctx):
    """Rank 0 holds the store: no rank leaves before all have their answers."""
    if ctx.store is not None:
        ctx.store.barrier("scenario-end", ctx.world_size, 60)
    os._exit(0)


def _fault_on_stream(cp):
    """Queue a kernel that hits an illegal address on the current stream (sticky)."""
    stream = cp.cuda.get_current_stream()
    try:
        from cupy import _double
        stream._enqueue_async(lambda: _double.fault(700))
    except ImportError:                    # a real GPU: a real faulting kernel
        cp.RawKernel('extern "C" __global__ void f() { *(volatile int*)16 = 1; }', "f")(
            (1,), (1,), ())


def _stall_stream(cp, seconds: float):
    """Queue a kernel that keeps the current stream busy for ``seconds``."""
    stream = cp.cuda.get_current_stream()
    try:
        from cupy import _double                                 # noqa: F401
        done = __import__("threading").Event()
        stream._enqueue_async(lambda: done.wait(seconds))
    except ImportError:
        rate = cp.cuda.Device().attributes["ClockRate"] * 1000      # kHz -> cycles/s
        cp.RawKernel('extern "C" __global__ void s(long long n) { long long t = clock64(); '
                     'while (clock64() - t < n) {} }', "s")((1,), (1,), (int(seconds * rate),))


def sticky(ctx):
    """Rank 1's stream faults just before an allreduce (queued on both): from the first call
    that sees it (the allreduce itself on rank 1, or synchronize) every call, synchronize,
    barrier and finalize raise the same error on every rank."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)
    ctx.synchronize()
    if ctx.rank == 1:
        _fault_on_stream(cp)
    errors = []
    for call in (lambda: ctx.allreduce(x), ctx.synchronize, lambda: ctx.allreduce(x),
                 ctx.barrier, rt.finalize):
        try:
            call()
            errors.append(None)
        except CollectiveError as exc:
            errors.append(str(exc))
    result(errors=errors)
    _leave_together(ctx)


def hang_in_flight(ctx):
    """Rank 1's stream stalls before its second allreduce: with that work in flight every
    rank gets the deadline error naming the collective."""
    import cupy as cp
    x = cp.ones(16, cp.float32)
    ctx.allreduce(x)
    ctx.synchronize()
    if ctx.rank == 1:
        _stall_stream(cp, TIMEOUT + 5)
    queued = time.monotonic()
    paced = sys.argv[2:] == ["paced"]          # a training loop: a call every 0.1 s for 20 s
    for _ in range(200 if paced else 3):
        ctx.allreduce(x)
        if paced:
            time.sleep(0.1)
    queued = time.monotonic() - queued
    outcome(ctx.synchronize, timed=True, exit_on_error=False)
    result(queued_seconds=queued)
    _leave_together(ctx)


def backpressure(ctx):
    """FLUIDCTL_GPU_INFLIGHT=2: rank 0 runs ahead of rank 1 (which starts late) and must wait
    for its oldest work once two are queued; synchronize then sees every result."""
    import cupy as cp
    xs = [cp.ones(8, cp.float32) for _ in range(6)]
    ctx.allreduce(xs[0])
    ctx.synchronize()
    work = ctx.comm.nccl.work
    if ctx.rank == 1:
        time.sleep(1.0)                    # the scenario: a late rank, not synchronisation
    seen, slow = [], []
    for x in xs:
        start = time.monotonic()
        ctx.allreduce(x)
        slow.append(time.monotonic() - start)
        seen.append(len(work.items))
    ctx.synchronize()
    result(inflight=seen, seconds=slow, after_sync=len(work.items),
           ok=all(bool((x.get() == ctx.world_size ** (2 if i == 0 else 1)).all())
                  for i, x in enumerate(xs)))
    rt.finalize()
    os._exit(0)


def coalesced(ctx):
    """Three collectives (one 'mean') in ``with ctx.coalesced():``: one NCCL group, one
    completion event, the right values (the division after the group's NCCL work)."""
    import cupy as cp
    work = ctx.comm.nccl.work
    xs = [cp.asarray(inputs(ctx.rank, "float32")) for _ in range(3)]
    ctx.allreduce(xs[0])
    ctx.synchronize()
    pushed = []
    real = work.push
    work.push = lambda *a: (pushed.append(a[1:]), real(*a))
    with ctx.coalesced():
        ctx.allreduce(xs[1])
        ctx.allreduce(xs[2], "mean")
        inside = len(pushed)
    ctx.synchronize()
    total = sum(inputs(k, "float32") for k in range(ctx.world_size))
    result(inside=inside, pushed=[list(p) for p in pushed],
           ok=bool(np.allclose(xs[1].get(), total)
                   and np.allclose(xs[2].get(), total / ctx.world_size)))
    rt.finalize()

def main():
    scenario = sys.argv[1]
    before = globals().get("before_" + scenario)
    state = before() if before else None
    try:
        ctx = rt.init(timeout=TIMEOUT)
    except CollectiveError as exc:
        result(init_error=str(exc))
        sys.exit(3)
    if state is not None:
        globals()[scenario](ctx, state)
    else:
        globals()[scenario](ctx)
    if scenario not in ("die", "die_in_kernel", "cuda_fault", "nccl_status8", "stuck",
                        "launch_error"):
        rt.finalize()


if __name__ == "__main__":
    main()
