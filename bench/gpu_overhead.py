"""fluidctl's own Python time per GPU collective, on the CuPy/NCCL double (no GPU needed).

    python bench/gpu_overhead.py [--calls 20000] [--size 4KiB]

One rank (a world of one) runs ``ctx.allreduce`` on a CuPy float32 array of ``--size`` with the
device work made no-ops: the NCCL call returns at once and the completion event is recorded
done. What is left is the path every call takes through fluidctl (metadata agreement by
signature, the launch, the event from the pool, the in-flight queue and its watchdog) plus the
CuPy reads it makes (``x.flags``, ``x.data``, the current stream, the device), which the double
serves in Python (about 1 us each) where real CuPy answers in Cython. So the bench prints the
call on the double's array as is, then on an array whose reads are plain attributes and with
the current stream and device as constants: that second figure is fluidctl's own Python.
Medians of ``--reps`` rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOUBLE = os.path.join(ROOT, "tests", "cupy_double")


def worker(args) -> None:
    import cupy as cp
    import fluidctl.runtime as rt
    ctx = rt.init()
    nccl = ctx.comm.nccl
    if nccl is None:
        raise SystemExit("bench/gpu_overhead.py: no GPU communicator (is the double on "
                         "PYTHONPATH?)")
    nccl.comm.allReduce = lambda *a: None           # the device work: none
    made = cp.cuda.Event(disable_timing=True)
    made.record = lambda stream=None: None          # recorded done (it starts done)
    nccl.work.event = lambda: made
    x = cp.ones(args.size // 4, cp.float32)
    class Plain:                                   # a CuPy array whose reads cost nothing
        pass
    Plain.__module__ = "cupy._core.core"
    fast = Plain()
    fast.flags = type("Flags", (), {"c_contiguous": True})()
    fast.data = type("Mem", (), {"device_id": 0, "ptr": x.data.ptr})()
    fast.dtype, fast.shape, fast.size, fast.nbytes, fast.ndim = \
        x.dtype, x.shape, x.size, x.nbytes, x.ndim

    def timed(arr):
        for _ in range(1000):
            ctx.allreduce(arr)
        ctx.synchronize()
        rounds = []
        for _ in range(args.reps):
            start = time.perf_counter()
            for _ in range(args.calls):
                ctx.allreduce(arr)
            rounds.append((time.perf_counter() - start) / args.calls)
            ctx.synchronize()
        return statistics.median(rounds)

    on_double = timed(x)
    stream = cp.cuda.get_current_stream()
    cp.cuda.get_current_stream = lambda device_id=-1: stream
    cp.cuda.runtime.getDevice = lambda: 0
    own = timed(fast)
    if os.environ.get("GPU_OVERHEAD_PROFILE"):
        import cProfile
        import pstats
        cProfile.runctx("for _ in range(20000): ctx.allreduce(fast)", globals(), locals(),
                        "/tmp/gpu_overhead.prof")
        pstats.Stats("/tmp/gpu_overhead.prof").sort_stats("tottime").print_stats(14)
    print(f"allreduce of {args.size} B float32 on one rank, device work as no-ops, median of "
          f"{args.reps} x {args.calls} calls")
    print(f"per call on the double's array:      {on_double * 1e6:6.2f} us")
    print(f"fluidctl's Python per GPU call:      {own * 1e6:6.2f} us (goal <= 5 us)")
    rt.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per round, e.g. 50000")
    ap.add_argument("--reps", type=int, default=5, help="rounds, e.g. 9")
    ap.add_argument("--size", default="4KiB", help="bytes, or with KiB/MiB, e.g. 1MiB")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    text = args.size
    args.size = next((int(float(text[:-3]) * m) for u, m in units.items()
                      if text.endswith(u)), None) or int(text)
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, ROOT)
    from fluidctl import envs
    from fluidctl.net import free_port
    env = dict(os.environ)
    env.update(envs.collective_env(rank=0, world_size=1, local_rank=0, local_size=1, nnodes=1,
                                   endpoints=[f"127.0.0.1:{free_port()}"],
                                   master=f"127.0.0.1:{free_port()}", gpus_on_node=["0"]))
    env["PYTHONPATH"] = os.pathsep.join([DOUBLE, ROOT, env.get("PYTHONPATH", "")])
    env["CUPY_DOUBLE_VERSION"] = env.get("CUPY_DOUBLE_VERSION", "14.2.0")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--calls",
                          str(args.calls), "--reps", str(args.reps), "--size", str(args.size)],
                         env=env, timeout=600)
    raise SystemExit(res.returncode)


if __name__ == "__main__":
    main()
