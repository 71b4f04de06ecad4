"""Elastic jobs under real faults, fluidctl beside torchrun, on 4 namespace nodes.

    python bench/elastic.py [--repeat 3] [--limit 40]      (root: network namespaces)

Makes node1..node4 (tests/netns.py: own address, own sshd, own cgroups), then, case by case
in one run, the same DDP-style job with its own checkpoints (30 steps of 50 ms, a world of at
most 3 nodes, at least 2; the 4th node a spare):
  fluidctl train --backend ssh --hostfile H --nodes 2:3 --max-restarts 3
      tests/scripts/elastic_train.py (fluidctl.runtime)
  torchrun --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint node1:29400 --max-restarts 3
      tests/scripts/torch_elastic.py, one torchrun per node started over ssh
and at step 8 a fault: SIGKILL of a node's agent (fluidctl's node agent, torchrun's elastic
agent), the node's link down, the node frozen (cgroup freezer), and the same link down on the
node that holds the job's rendezvous (fluidctl: MASTER_ADDR's node; torchrun: the c10d store's).
Measured from the fault: detection (fluidctl: its launch.log line declaring the node lost or its
agent ended; torchrun: the first line any surviving agent writes about a failure or a
restart) and the first completed step of the new world (the job's progress.log); whether the
job finished with the reference weights; processes left on the nodes but sshd once the job is
over (the launchers had 10 s more to end, then 5 s). A case that does not recover within
--limit seconds of the fault counts as failed (its times as "-"); a fault that ends no rank
(torchrun's workers outlive a killed agent) shows no new world either. Prints
one row per case and launcher, medians over --repeat rounds, and the ratios.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import netns  # noqa: E402
from elasticrun import (FAULTS, Fault, elastic_train, first_step_after, heal,  # noqa: E402
                        kill_matching, last_step, leftovers, master_alias, progress,
                        run_elastic, running)
from launchutil import wait_for  # noqa: E402

TORCH_SCRIPT = ROOT / "tests" / "scripts" / "torch_elastic.py"
CASES = [("agent-kill", "node2"), ("link-down", "node2"), ("freeze", "node2"),
         ("link-down", "master")]
STEPS, PAUSE, AT = 30, 0.05, 8
TORCH_FAILURE = re.compile(r"restart|FAILED|[Ee]rror|[Ff]ailed|[Rr]endezvous|SIGKILL|exit")


def kill_torchrun(nodes, alias):
    """SIGKILL the node's torchrun (its elastic agent; its workers stay)."""
    kill_matching(nodes, alias, "torch.distributed.run")


def clean(nodes):
    """What a case left on the nodes (counted), then killed: the next case starts clean."""
    left = leftovers(nodes, timeout=5.0)
    if left and os.environ.get("BENCH_VERBOSE"):
        print(f"left on the nodes: {left}", flush=True)
    for alias, procs in left.items():
        for entry in procs:
            try:
                os.kill(int(entry.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    return sum(len(p) for p in left.values())


def fluidctl_case(nodes, work, kind, alias, limit):
    outcome = run_elastic(nodes, work, node_range="2:3", steps=STEPS, pause=PAUSE,
                          faults=[Fault(AT, kind, (alias,))], timeout=limit + 60)
    fault = outcome.faults[0]
    ok = outcome.code == 0 and outcome.weights == outcome.reference
    clean(nodes)
    return dict(ok=ok, detected=fault.detected, first=fault.first_step if ok else None,
                left=sum(len(p) for p in outcome.leftovers.values()),
                restarts=len(outcome.starts) - 1)


def torchrun_case(nodes, work, kind, alias, limit):
    work.mkdir(parents=True)
    ckpt = work / "ckpt"
    ckpt.mkdir()
    store = nodes.node("node1").address
    procs, outs = {}, {}
    for name, node in nodes.nodes.items():
        outs[name] = work / f"torchrun.{name}.log"
        command = (f"cd {work} && GLOO_SOCKET_IFNAME=eth0 exec python3 -m torch.distributed.run "
                   f"--nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "
                   f"{store}:29400 --rdzv-id bench --max-restarts 3 --local-addr {node.address} "
                   f"--rdzv-conf is_host={int(name == 'node1')} "
                   f"{TORCH_SCRIPT} {STEPS} {ckpt} {PAUSE}")
        procs[name] = subprocess.Popen(
            ["ssh", "-F", str(nodes.config), "-o", "BatchMode=yes", name, command],
            stdout=open(outs[name], "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    detected = first = None
    hit = "node1"
    try:
        wait_for(lambda: last_step(ckpt) >= AT, limit + 60, f"torchrun's step {AT}")
        if alias != "master":       # a node of the world, neither the store's nor rank 0's
            ranks0 = master_alias(ckpt, nodes)
            hit = next(a for a in nodes.nodes if a not in ("node1", ranks0)
                       and set(running(nodes, a, TORCH_SCRIPT.name))    # a worker, not
                       - set(running(nodes, a, "torch.distributed.run")))  # an agent only
        {"agent-kill": kill_torchrun}.get(kind, FAULTS.get(kind))(nodes, hit)
        when = time.time()
        sizes = {n: p.stat().st_size for n, p in outs.items()}
        end = time.monotonic() + limit
        while time.monotonic() < end and not (ckpt / "final.json").exists():
            if detected is None:
                for name, path in outs.items():
                    if name != hit and TORCH_FAILURE.search(path.read_text()[sizes[name]:]):
                        detected = time.time() - when
                        break
            if all(p.poll() is not None for n, p in procs.items() if n != hit):
                break
            time.sleep(0.02)
        for name, p in procs.items():       # the job is over: do the launchers end?
            if name != hit:
                try:
                    p.wait(max(0.0, min(end - time.monotonic(), 10.0)))
                except subprocess.TimeoutExpired:
                    pass
        first = first_step_after(progress(ckpt), when)
    finally:
        heal(nodes, kind, hit)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    final = ckpt / "final.json"
    worlds = {}
    for line in progress(ckpt):
        if line.startswith("step "):
            worlds[int(line.split()[1])] = int(line.split()[3])
    seq = [worlds.get(s, 0) for s in range(1, STEPS + 1)]
    ok = final.exists() and 0 not in seq and \
        json.loads(final.read_text())["w"] == elastic_train.reference(seq)
    left = clean(nodes)
    starts = [line for line in progress(ckpt) if line.startswith("start ")]
    return dict(ok=ok, detected=detected, first=first if ok else None, left=left,
                restarts=len(starts) - 1)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value):
    return "-" if value is None else f"{value:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=float, default=40.0,
                    help="seconds from the fault to the end of the job before a case fails")
    args = ap.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(why)
    work = Path(tempfile.mkdtemp(prefix="fluidctl-bench-elastic-"))
    nodes = netns.NetnsNodes.start(work / "nodes", 4)
    results = {}
    try:
        for r in range(args.repeat):
            for kind, alias in CASES:
                case = f"{kind} ({'the master node' if alias == 'master' else alias})"
                for name, run in (("fluidctl", fluidctl_case), ("torchrun", torchrun_case)):
                    res = run(nodes, work / f"{r}-{kind}-{alias}-{name}", kind, alias,
                              args.limit)
                    results.setdefault((case, name), []).append(res)
                    print(f"round {r + 1}: {case:28} {name:9} recovered {res['ok']!s:5} "
                          f"detected {fmt(res['detected'])} s, first step {fmt(res['first'])}"
                          f" s, restarts {res['restarts']}, left on nodes {res['left']}",
                          flush=True)
    finally:
        nodes.stop()
    print(f"\n4 namespace nodes, world 2:3 (one spare), {STEPS} steps of {PAUSE * 1000:g} ms, "
          f"fault at step {AT}; medians of {args.repeat} round(s), seconds from the fault")
    print(f"{'fault':30} {'launcher':9} {'recovered':>9} {'detected':>9} {'first step':>10} "
          f"{'left':>5}")
    for (case, name), runs in results.items():
        print(f"{case:30} {name:9} {sum(r['ok'] for r in runs):>5}/{len(runs):<3} "
              f"{fmt(median(r['detected'] for r in runs)):>9} "
              f"{fmt(median(r['first'] for r in runs)):>10} "
              f"{sum(r['left'] for r in runs):>5}")
    ours = [median(r["first"] for r in results[(c, "fluidctl")])
            for c in {k[0] for k in results}]
    theirs = [median(r["first"] for r in results[(c, "torchrun")])
              for c in {k[0] for k in results}]
    pairs = [(a, b) for a, b in zip(ours, theirs) if a is not None and b is not None]
    if pairs:
        print("fault to first step, fluidctl / torchrun over the faults both recovered from: "
              f"{statistics.median(a for a, _ in pairs):.2f} s / "
              f"{statistics.median(b for _, b in pairs):.2f} s = "
              f"{statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs):.2f}x")


if __name__ == "__main__":
    main()
