"""What preemption costs: the per-step check, a checkpoint on request, a requeued job's restart.

    python bench/preempt.py --repeat 5                 # 2 ranks on this machine
    python bench/preempt.py --requeue                  # + the requeue on the test Slurm

1. ``ctx.checkpoint_requested()`` per call, in a 2-rank job (the agreement's allreduce is paid
   about every 50 ms), beside one ``os.stat`` of the request file and beside a one-number
   max-allreduce on every call (the naive agreement).
2. From the request (the request file written, as the launcher does on SIGUSR1) to every rank
   back from ``Checkpointer.save`` (agreement, parts hashed and fsynced, manifest, rename), for
   a 64 MiB and a 1 GiB float32 model split over the 2 ranks, on local disk; beside each rank
   ``numpy.save`` + fsync of its same bytes, then a barrier. Medians of --repeat.
3. ``--requeue``: on the test Slurm (tests/slurm.py), a 2 x 2 job is asked with
   ``scancel --signal=USR1``; the time from its requeued run's start (squeue says RUNNING,
   polled every 50 ms) to its first optimizer step (rank 0's log).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"64MiB": 64 << 20, "1GiB": 1 << 30}


def rank_main(args) -> None:
    import numpy as np

    import fluidctl.runtime as rt
    from fluidctl import envs
    from fluidctl.runtime.checkpoint import Checkpointer
    ctx = rt.init()
    request = Path(os.environ[envs.CHECKPOINT_REQUEST])
    out = {}
    # 1. the per-call cost
    n = 200_000
    calls = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        for _ in range(n):
            ctx.checkpoint_requested()
        calls.append((time.perf_counter() - t) / n)
    out["call_s"] = statistics.median(calls)
    t = time.perf_counter()
    for _ in range(20_000):
        try:
            os.stat(request)
        except FileNotFoundError:
            pass
    out["stat_s"] = (time.perf_counter() - t) / 20_000
    one = np.zeros(1, dtype=np.int64)
    t = time.perf_counter()
    for _ in range(2_000):
        ctx.allreduce(one, op="max")
    out["allreduce_s"] = (time.perf_counter() - t) / 2_000
    # 2. request -> committed, beside numpy.save + fsync of the same bytes
    work = Path(args.dir)
    for name, size in SIZES.items():
        part = np.random.default_rng(ctx.rank).standard_normal(
            size // 4 // ctx.world_size, dtype=np.float32)
        ours, peer = [], []
        ck = Checkpointer(ctx, work / f"ck-{name}", keep=1)
        for i in range(args.repeat):
            ctx.barrier()
            if ctx.rank == 0:
                request.write_text("save bench\n")
            t = time.perf_counter()
            while not ctx.checkpoint_requested():
                pass
            ck.save(i, {"w": part})
            ours.append(time.perf_counter() - t)
            ctx.barrier()
            t = time.perf_counter()
            path = work / f"peer-{name}.{ctx.rank}.npy"
            with open(path, "wb") as f:
                np.save(f, part)
                f.flush()
                os.fsync(f.fileno())
            ctx.barrier()
            peer.append(time.perf_counter() - t)
            path.unlink()
        out[name] = {"ours_s": statistics.median(ours), "peer_s": statistics.median(peer)}
    if ctx.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    rt.finalize()


def local(args) -> dict:
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--nproc", "2",
                              "--log-dir", os.path.join(work, "log"), __file__, "--rank",
                              "--dir", work, "--repeat", str(args.repeat)],
                             capture_output=True, text=True, timeout=1800)
        line = next((l for l in res.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"bench job failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
        return json.loads(line[7:])


def requeue(args) -> float:
    sys.path.insert(0, str(ROOT / "tests"))
    from slurm import SlurmCluster
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        cluster = SlurmCluster.start(work / "slurm")
        try:
            env = cluster.env(FLUIDCTL_STATE_DIR=str(work / "state"))
            res = subprocess.run(
                [sys.executable, "-m", "fluidctl", "train", "--backend", "slurm", "--nodes",
                 "2", "--nproc", "2", "--detach", "--log-dir", str(work / "log"),
                 str(ROOT / "tests" / "scripts" / "preempt_train.py"), "--ckpt",
                 str(work / "ck"), "--out", str(work / "out"), "--steps", "400",
                 "--step-time", "0.05"], env=env, capture_output=True, text=True, timeout=60)
            job = res.stderr.split("submitted Slurm job ")[1].split()[0]
            steps = work / "out" / "steps.0"
            deadline = time.monotonic() + 60
            while not (steps.exists() and len(steps.read_text().split()) > 10):
                if time.monotonic() > deadline:
                    sys.exit("the job did not start")
                time.sleep(0.05)
            cluster.run("scancel", "--signal=USR1", job)
            seen, started = "", None
            deadline = time.monotonic() + 120
            while started is None and time.monotonic() < deadline:
                state = cluster.run("squeue", "-h", "-j", job, "-o", "%T", check=False)
                now = time.time()
                if state.stdout.strip() == "PENDING":
                    seen = "PENDING"
                elif seen == "PENDING" and state.stdout.strip() == "RUNNING":
                    started = now
                time.sleep(0.05)
            log = work / "log" / f"slurm-{job}" / "workerlog.0"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                firsts = [float(l.split(" at ")[1]) for l in log.read_text().splitlines()
                          if l.startswith("first step")] if log.exists() else []
                firsts = [t for t in firsts if started is not None and t > started]
                if firsts:          # the requeued run's (its fluidctl starts the log afresh)
                    cluster.run("scancel", job, check=False)
                    return firsts[0] - started
                time.sleep(0.1)
            sys.exit("the requeued job made no step")
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where checkpoints go (local disk; not a tmpfs)")
    parser.add_argument("--requeue", action="store_true")
    parser.add_argument("--requeue-only", action="store_true", help="skip parts 1 and 2")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    if args.requeue_only:
        print(f"requeued job start -> first step: {requeue(args):.2f} s")
        return
    out = local(args)
    print(f"checkpoint_requested() per call: {out['call_s'] * 1e9:.0f} ns; one os.stat: "
          f"{out['stat_s'] * 1e9:.0f} ns; a max-allreduce every call: "
          f"{out['allreduce_s'] * 1e6:.1f} us (2 ranks)")
    for name in SIZES:
        ours, peer = out[name]["ours_s"], out[name]["peer_s"]
        print(f"{name}: request -> every rank committed {ours:.3f} s; numpy.save + fsync "
              f"{peer:.3f} s; {ours / peer:.2f}x")
    if args.requeue:
        print(f"requeued job start -> first step: {requeue(args):.2f} s")


if __name__ == "__main__":
    main()
