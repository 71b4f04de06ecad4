"""Parameter-server performance and load, measured against this machine's own loopback.

    python bench/pserver.py sync    # 64 MiB float32 model, 2 trainers x 2 pservers, sync SGD:
                                    # median step (push + pull) vs the wire limit = bytes moved
                                    # per step / one loopback TCP stream's bandwidth (measured
                                    # in the same run by streaming 1 GiB between two processes)
    python bench/pserver.py async   # async updates/s, 2 trainers x 2 pservers, 64 MiB and 1 MiB
    python bench/pserver.py load    # 16 trainers async x 500 steps (dense + sparse) vs 2
                                    # pservers: applied == pushed, no deadlock, pserver RSS flat
    python bench/pserver.py all

Every mode starts real processes (fluidctl.runtime.pserver.local) and prints one summary line
per figure; --json FILE also writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

from fluidctl import envs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import pserverutil as local  # noqa: E402  (the tests' helper that starts local pservers)

TOKEN = "bench-token"
MIB = 1 << 20


# --- workers (this file re-run with --worker) ------------------------------------------------

def trainer_worker(steps: int, elements: int, sparse: bool, lr: float) -> None:
    from fluidctl.runtime import optim
    from fluidctl.runtime.pserver.client import PServerOptimizer
    env = envs.read()
    rows = max(1, elements // 1024)
    params = {"w": np.zeros((rows, 1024), np.float32)}
    grads = {"w": np.full((rows, 1024), 1e-3, np.float32)}
    opt = PServerOptimizer(params, optimizer=optim.SGD(lr))
    table = opt.sparse_table("emb", dim=16, dict_size=100_000) if sparse else None
    rng = np.random.default_rng(env.rank)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step(grads)
        if table is not None:
            ids = rng.integers(0, 20_000, size=64)
            table.push(ids, table.pull(ids) * 0 + 1e-3)
        times.append(time.perf_counter() - t0)
    stats = opt.stats()
    opt.close()
    print(json.dumps({"rank": env.rank, "times": times, "stats": stats}))


def stream_sender(port: int, total: int, chunk: int) -> None:
    buf = np.ones(chunk // 4, np.float32)
    sock = socket.create_connection(("127.0.0.1", port))
    sent = 0
    while sent < total:
        sock.sendall(buf)
        sent += chunk
    sock.close()


# --- measurements ----------------------------------------------------------------------------

def loopback_bandwidth(total: int = 1 << 30, chunk: int = 64 * MIB) -> float:
    """Bytes/s of one TCP stream over loopback between two processes (sendall / recv_into)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sender = subprocess.Popen([sys.executable, __file__, "--worker", "stream", "--port",
                               str(port), "--bytes", str(total), "--chunk", str(chunk)])
    conn, _ = listener.accept()
    view = memoryview(bytearray(chunk))
    got, t0 = 0, None
    while got < total:
        k = conn.recv_into(view)
        if not k:
            break
        if t0 is None:
            t0 = time.perf_counter()
        got += k
    elapsed = time.perf_counter() - t0
    conn.close()
    listener.close()
    sender.wait()
    return got / elapsed


def run_job(pservers: int, trainers: int, sync: bool, steps: int, elements: int,
            sparse: bool = False, watch_rss: bool = False, timeout: float = 900.0) -> dict:
    endpoints = [f"127.0.0.1:{p}" for p in local.free_ports(pservers)]
    servers = [local.start_pserver(i, endpoints, trainers, sync=sync, token=TOKEN,
                                   args=["--no-state", "--max-frame-mb", "2048"])
               for i in range(pservers)]
    rss = {}
    try:
        workers = [subprocess.Popen(
            [sys.executable, __file__, "--worker", "trainer", "--steps", str(steps),
             "--elements", str(elements)] + (["--sparse"] if sparse else []),
            env=local.role_env(envs.ROLE_TRAINER, t, endpoints, trainers, sync, TOKEN),
            stdout=subprocess.PIPE) for t in range(trainers)]
        t0 = time.perf_counter()
        if watch_rss:
            rss = watch_server_rss(servers, endpoints, workers, trainers * steps * pservers,
                                   timeout)
        outputs = []
        for w in workers:
            out, _ = w.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            if w.returncode != 0:
                raise RuntimeError(f"a trainer failed with exit code {w.returncode}")
            outputs.append(json.loads(out))
        wall = time.perf_counter() - t0
    finally:
        codes = local.stop(servers)
    return {"outputs": outputs, "wall": wall, "rss": rss, "server_exit_codes": codes}


def watch_server_rss(servers, endpoints, workers, total_pushes, timeout):
    """Pserver RSS (sum, MiB) at 10%, 50% and 100% of the pushes (progress read from the
    servers' own counters, so a slow start on a busy machine does not count as growth)."""
    import psutil
    from fluidctl.runtime import wire
    procs = [psutil.Process(s.pid) for s in servers]
    socks = [wire.connect(ep, TOKEN) for ep in endpoints]

    def pushed():
        total = 0
        for sock in socks:
            wire.send_frame(sock, {"op": "stats"})
            total += wire.recv_frame(sock)[0]["pushed"]
        return total
    marks, samples = (0.1, 0.5), {}
    start = time.monotonic()
    try:
        while any(w.poll() is None for w in workers):
            if time.monotonic() - start > timeout:
                raise RuntimeError("load test did not finish: deadlock?")
            rss = sum(p.memory_info().rss for p in procs) / MIB
            done = pushed() / total_pushes
            for mark in marks:
                if done >= mark and mark not in samples:
                    samples[mark] = rss
            samples[1.0] = rss
            time.sleep(0.1)
    finally:
        for sock in socks:
            sock.close()
    return samples


def bench_sync(args) -> dict:
    """Each repeat measures the stream bandwidth right before its job (the machine is shared,
    so both sides of a ratio see the same load); the median repeat is reported."""
    elements = args.model_mib * MIB // 4
    moved = 2 * 2 * elements * 4                      # 2 trainers x (push + pull) x model
    runs = []
    for _ in range(args.repeats):
        bw = loopback_bandwidth()
        job = run_job(2, 2, True, args.steps + 2, elements)
        step = max(statistics.median(o["times"][2:]) for o in job["outputs"])
        runs.append({"median_step_s": step, "loopback_bytes_per_s": bw,
                     "wire_limit_s": moved / bw, "ratio": step * bw / moved})
    best = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
    return {"mode": "sync", "model_mib": args.model_mib, "trainers": 2, "pservers": 2,
            "bytes_per_step": moved, "repeats": runs,
            "ratios": [round(r["ratio"], 2) for r in runs], **best}


def bench_async(args) -> dict:
    out = {"mode": "async", "trainers": 2, "pservers": 2}
    for mib, steps in ((args.model_mib, args.steps), (1, 300)):
        job = run_job(2, 2, False, steps, mib * MIB // 4)
        total = sum(len(o["times"]) for o in job["outputs"])
        busy = max(sum(o["times"]) for o in job["outputs"])
        out[f"updates_per_s_{mib}mib"] = total / busy
    return out


def bench_load(args) -> dict:
    trainers, steps = 16, 500
    job = run_job(2, trainers, False, steps, 65536, sparse=True, watch_rss=True)
    final = job["outputs"][-1]["stats"]
    # the last trainer to finish saw every push; ask the freshest stats of each server
    stats = [max((o["stats"][i] for o in job["outputs"]), key=lambda s: s["pushed"])
             for i in range(2)]
    pushed = trainers * steps
    return {"mode": "load", "trainers": trainers, "steps": steps, "pservers": 2,
            "pushed_per_server": pushed,
            "applied_per_server": [s["applied"] for s in stats],
            "received_per_server": [s["pushed"] for s in stats],
            "sparse_pushes_per_server": [s["sparse_pushed"] for s in stats],
            "all_applied": all(s["applied"] == s["pushed"] == pushed for s in stats),
            "wall_s": job["wall"], "server_rss_mib": job["rss"], "server_exit_codes":
            job["server_exit_codes"], "last_stats": final}


def report(result: dict) -> None:
    mode = result["mode"]
    if mode == "sync":
        print(f"sync  {result['model_mib']} MiB model, 2 trainers x 2 pservers: median step "
              f"{result['median_step_s'] * 1e3:.0f} ms; wire limit "
              f"{result['wire_limit_s'] * 1e3:.0f} ms ({result['bytes_per_step'] / MIB:.0f} MiB "
              f"at {result['loopback_bytes_per_s'] / 1e9:.2f} GB/s, one loopback stream); "
              f"ratio {result['ratio']:.2f}x (median of {len(result['ratios'])} repeats: "
              f"{result['ratios']})")
    elif mode == "async":
        rates = ", ".join(f"{k.split('_')[-1]}: {v:.1f} updates/s" for k, v in result.items()
                          if k.startswith("updates_per_s"))
        print(f"async 2 trainers x 2 pservers: {rates}")
    else:
        print(f"load  16 trainers async x 500 steps vs 2 pservers: pushed "
              f"{result['pushed_per_server']}/server, applied {result['applied_per_server']}, "
              f"all applied: {result['all_applied']}; {result['wall_s']:.1f} s; pserver RSS "
              + " -> ".join(f"{v:.0f} MiB ({k:.0%})" for k, v in
                            sorted(result["server_rss_mib"].items()))
              + f"; exit codes {result['server_exit_codes']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="all", choices=["sync", "async", "load", "all"])
    p.add_argument("--model-mib", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--worker", choices=["trainer", "stream"], help=argparse.SUPPRESS)
    p.add_argument("--elements", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sparse", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "trainer":
        trainer_worker(args.steps, args.elements, args.sparse, lr=1e-3)
        return 0
    if args.worker == "stream":
        stream_sender(args.port, args.bytes, args.chunk)
        return 0
    modes = ["sync", "async", "load"] if args.mode == "all" else [args.mode]
    results = []
    for mode in modes:
        result = {"sync": bench_sync, "async": bench_async, "load": bench_load}[mode](args)
        report(result)
        results.append(result)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0 if all(r.get("all_applied", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
