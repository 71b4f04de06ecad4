"""GPU allreduce bus bandwidth: fluidctl's NCCL path (CuPy) vs torch.distributed's NCCL, on the
same GPUs, in the same invocation.

    python bench/gpu_allreduce.py [--gpus 2] [--reps 10] [--sizes 1MiB,64MiB,256MiB]

Starts one process per GPU (the environment ``fluidctl train --gpus N`` gives), and in each
process times fluidctl's ``ctx.allreduce`` on a CuPy float32 array, then torch's
``dist.all_reduce`` on a CUDA tensor of the same size, alternating rounds so both see the same
machine state. Prints median time per call, busbw = S / t * 2(n-1)/n (nccl-tests' definition;
on one GPU algbw = S / t, labelled so) and fluidctl/torch (goal: >= 0.95x from 64 MiB). ``--peer none`` skips torch.
Both return once the call is queued on the current stream and both timing loops sync once per
batch of calls; fluidctl's figure includes its metadata agreement (in full on a signature's
first use, then a hash compared about every 50 ms). bench/gpu_overhead.py prints fluidctl's
own Python per call without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    for unit, mult in UNITS.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def human(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]} {unit}"
    return f"{n} B"


def timed(call, sync, calls: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls


def worker(args) -> None:
    import numpy as np
    import fluidctl.runtime as rt
    ctx = rt.init()
    if ctx.device_id is None:
        raise SystemExit(f"rank {ctx.rank}: no GPU communicator (device {ctx.device})")
    import cupy as cp
    torch = dist = None
    if args.peer == "torch":
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(ctx.device_id)
        dist.init_process_group("nccl", rank=ctx.rank, world_size=ctx.world_size,
                                device_id=torch.device("cuda", ctx.device_id))
    stream = cp.cuda.get_current_stream()
    results = {}
    for size in args.sizes:
        x = cp.ones(size // 4, cp.float32)
        contenders = {"fluidctl": (lambda: ctx.allreduce(x), stream.synchronize)}
        if torch is not None:
            t = torch.ones(size // 4, dtype=torch.float32, device=f"cuda:{ctx.device_id}")
            contenders["torch"] = (lambda: dist.all_reduce(t), torch.cuda.synchronize)
        for call, sync in contenders.values():           # warm up
            for _ in range(3):
                call()
            sync()
        calls = 20 if size < (16 << 20) else 5
        times = {name: [] for name in contenders}
        for _ in range(args.reps):
            for name, (call, sync) in contenders.items():
                ctx.barrier()
                times[name].append(timed(call, sync, calls))
        results[size] = times
    if ctx.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": ctx.world_size, "results": results}, f)
    if dist is not None:
        dist.destroy_process_group()
    rt.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="processes, one per GPU, e.g. 8")
    ap.add_argument("--reps", type=int, default=10, help="timed rounds per size, e.g. 20")
    ap.add_argument("--sizes", default="1MiB,16MiB,64MiB,256MiB",
                    help="message sizes, e.g. 4KiB,64MiB")
    ap.add_argument("--peer", choices=["torch", "none"], default="torch",
                    help="compare with torch.distributed NCCL (default) or nothing")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, ROOT)
    from fluidctl.planning.devices import discover_gpus
    found = discover_gpus(os.environ)
    if len(found) < args.gpus:
        raise SystemExit(f"bench/gpu_allreduce.py: needs {args.gpus} GPU(s), nvidia-smi lists "
                         f"{len(found)} (run it on a GPU machine with pip install -e '.[gpu]')")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "fluidctl", "train", "--gpus", str(args.gpus),
               "--log-dir", os.path.join(tmp, "log"), "--tee", "none",
               os.path.abspath(__file__), "--worker", "--out", out, "--reps", str(args.reps),
               "--sizes", ",".join(map(str, args.sizes)), "--peer", args.peer]
        res = subprocess.run(cmd, cwd=ROOT)
        if res.returncode != 0 or not os.path.exists(out):
            logs = os.path.join(tmp, "log", "workerlog.0")
            if os.path.exists(logs):
                sys.stderr.write(open(logs).read()[-4000:])
            raise SystemExit(f"bench/gpu_allreduce.py: the job failed (exit {res.returncode})")
        with open(out) as f:
            data = json.load(f)
    n = data["world"]
    # nccl-tests' busbw is S/t x 2(n-1)/n: 0 on one GPU (nothing crosses a bus), so one GPU
    # reports algbw = S/t, and says so
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    figure = "busbw = S/t x 2(n-1)/n" if n > 1 else \
        "algbw = S/t: one GPU moves nothing between GPUs, busbw would be 0"
    print(f"allreduce float32 sum, {n} GPU(s), median of {args.reps} rounds ({figure})")
    print("| size | fluidctl (NCCL via CuPy) | torch.distributed NCCL | fluidctl/torch |")
    print("|---|---|---|---|")
    for size, times in data["results"].items():
        size = int(size)
        row = []
        med = {k: statistics.median(v) for k, v in times.items()}
        for name in ("fluidctl", "torch"):
            if name in med:
                row.append(f"{size / med[name] * factor / 1e9:.2f} GB/s "
                           f"({med[name] * 1e6:.0f} us)")
            else:
                row.append("-")
        ratio = f"{med['torch'] / med['fluidctl']:.2f}x" if "torch" in med else "-"
        print(f"| {human(size)} | {row[0]} | {row[1]} | {ratio} |")


if __name__ == "__main__":
    main()
