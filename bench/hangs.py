"""What fluidctl and torchrun say about the same faults, and how long after the fault.

Three namespace nodes (tests/netns.py: own network stack, sshd and cgroups each; needs root),
one rank each, the same data-parallel loop (tests/scripts/straggle.py on fluidctl.runtime,
tests/scripts/straggle_torch.py on torch's gloo). Each fault comes once rank 0 has done
--warm steps, on a fresh set of nodes:

- compute: node2's CPU throttled to 5% of a core (cgroup cpu quota);
- link: node2's link capped at 20 mbit/s both ways (tc tbf), 256 KiB gradients;
- data: rank 1's data loader sleeps 100 ms per batch from step --warm;
- sigstop: rank 1 stopped (SIGSTOP);
- frozen: node2 frozen whole (cgroup freezer: every process on it, sshd and agent too);
- partition: node2's link cut (its end of the link down).

For the last three fluidctl runs with --hang-timeout 10; torchrun has no hang timeout of its
own (gloo's collective timeout is 30 minutes), so what it says within --window is all there is.

fluidctl runs as `fluidctl train --hostfile ... --ssh-config ...`, on fluidctl.runtime's script
(tool "fluidctl") and on the very torch script torchrun runs, unmodified ("fluidctl-torch":
its straggler report comes from torch's Flight Recorder); torchrun as one
`python -m torch.distributed.run --nnodes 3 --node-rank K ...` per node over ssh. For each
the bench records the first line after the fault that is not the script's own "step N"
(what it says) and when it came, watching for --window seconds, and rank 0's step time
before and after the fault (that the fault was real). Every namespace, link and cgroup made is
removed at the end of each fault's run, also when the bench is interrupted (Ctrl-C, SIGTERM,
SIGHUP), and every process it started is stopped by pid.

    sudo python bench/hangs.py --window 40 [--faults frozen,partition] [--tools fluidctl]
"""
import argparse
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import netns  # noqa: E402

SCRIPTS = {"fluidctl": ROOT / "tests" / "scripts" / "straggle.py",
           "fluidctl-torch": ROOT / "tests" / "scripts" / "straggle_torch.py",
           "torchrun": ROOT / "tests" / "scripts" / "straggle_torch.py"}
TOOLS = "fluidctl,fluidctl-torch,torchrun"
STEP = re.compile(r"(?:^|\] )step (\d+)$")
HANG_FAULTS = ("sigstop", "frozen", "partition")      # fluidctl runs with --hang-timeout
FAULTS = "compute,link,data,sigstop,frozen,partition"
NOISE = re.compile(r"^\s*$|^W\d+ .*OMP_NUM_THREADS|^\*{10}|Setting OMP_NUM_THREADS")


class Lines:
    """Every line of some pipes, stamped with time.monotonic() when read."""

    def __init__(self):
        self.q: "queue.Queue" = queue.Queue()
        self.seen = []

    def follow(self, pipe, where: str) -> None:
        def pump():
            for line in pipe:
                self.q.put((time.monotonic(), where, line.rstrip("\n")))
        threading.Thread(target=pump, daemon=True).start()

    def until(self, predicate, deadline: float):
        """Lines until one satisfies ``predicate`` (returned) or ``deadline`` passes."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                item = self.q.get(timeout=left)
            except queue.Empty:
                return None
            self.seen.append(item)
            if predicate(item):
                return item


def steps_of(lines, since=None, until=None):
    return [(t, int(m.group(1))) for t, _, text in lines
            for m in [STEP.search(text)] if m and (since is None or t >= since)
            and (until is None or t <= until)]


def step_time(points):
    if len(points) < 2:
        return None
    return (points[-1][0] - points[0][0]) / max(1, points[-1][1] - points[0][1])


def start(tool: str, nodes, work: Path, fault: str, warm: int):
    script = [str(SCRIPTS[tool]), "--stop-file", str(work / "STOP")]
    if fault == "link":
        script += ["--floats", str(64 << 10)]
    if fault == "data":
        script += ["--slow-data", f"1:100:{warm}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tool.startswith("fluidctl"):
        argv = [sys.executable, "-m", "fluidctl", "train", "--hostfile", str(nodes.hostfile()),
                "--ssh-config", str(nodes.config)]
        if fault in HANG_FAULTS:
            argv += ["--hang-timeout", "10"]
        return [subprocess.Popen(argv + script, cwd=work, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)]
    master = nodes.node("node1").address
    procs = []
    for k, alias in enumerate(sorted(nodes.nodes)):
        remote = (f"cd {shlex.quote(str(work))} && GLOO_SOCKET_IFNAME=eth0 exec {sys.executable} -m "
                  f"torch.distributed.run --nnodes 3 --nproc-per-node 1 --node-rank {k} "
                  f"--master-addr {master} --master-port 29511 "
                  + " ".join(map(shlex.quote, script)))
        procs.append(subprocess.Popen(["ssh", "-F", str(nodes.config), "-o", "BatchMode=yes",
                                       alias, remote], cwd=work, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


def rank_pid(nodes, alias: str, script: Path):
    import psutil
    for pid in nodes.pids(alias):
        try:
            p = psutil.Process(pid)
            if str(script) in p.cmdline() and "torch.distributed.run" not in p.cmdline():
                return pid
        except psutil.Error:
            continue
    return None


def inject(fault: str, nodes, tool: str) -> None:
    if fault == "compute":
        nodes.throttle_cpu("node2", 0.05)
    elif fault == "link":
        nodes.cap_link("node2", "20mbit")
    elif fault == "sigstop":
        pid = rank_pid(nodes, "node2", SCRIPTS[tool])
        assert pid, "rank 1's process not found on node2"
        os.kill(pid, signal.SIGSTOP)
    elif fault == "frozen":
        nodes.freeze("node2")
    elif fault == "partition":
        nodes.link_down("node2")
    elif fault == "data":
        pass                # the script's own --slow-data, from step --warm
    else:
        raise ValueError(f"unknown fault {fault!r}")


def stop_tree(proc: subprocess.Popen, grace: float) -> None:
    """Stop a process this bench started and every process under it, by pid: wait ``grace``
    seconds for it to end on its own, then SIGTERM, then SIGKILL what is left."""
    import psutil
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for child in below:
        try:
            child.kill()
        except psutil.Error:
            pass


def one(tool: str, fault: str, warm: int, window: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"hangs-{tool}-{fault}-"))
    nodes = netns.NetnsNodes.start(work / "nodes", 3)      # removes what it made if it fails
    lines = Lines()
    procs = []
    try:
        procs = start(tool, nodes, work, fault, warm)
        for i, p in enumerate(procs):
            lines.follow(p.stdout, f"node{i + 1}")
        came = lines.until(lambda it: (m := STEP.search(it[2])) and int(m.group(1)) >= warm,
                           time.monotonic() + 120)
        assert came, f"{tool} never reached step {warm}: " + "\n".join(
            f"[{w}] {text}" for _, w, text in lines.seen[:60])
        t0 = time.monotonic()
        inject(fault, nodes, tool)

        def says(item):
            t, where, text = item
            return t >= t0 and not STEP.search(text) and not NOISE.search(text)
        said = lines.until(says, t0 + window)
        lines.until(lambda it: False, time.monotonic() + (4 if said else 0))  # steps after it
        before = step_time(steps_of(lines.seen, until=t0))
        after = step_time(steps_of(lines.seen, since=t0 + 1))
        why = next((text.strip() for t, _, text in lines.seen
                    if said and t >= said[0] and text.startswith("  why: ")), None)
        return {"tool": tool, "fault": fault, "said": said[2].strip() if said else None,
                "why": why,
                "after_s": said[0] - t0 if said else None, "step_before": before,
                "step_after": after}
    finally:
        (work / "STOP").write_text("")
        try:
            for p in procs:
                stop_tree(p, 20 if fault not in HANG_FAULTS else 1)
        finally:
            nodes.stop()        # thaws a frozen node, kills what is left, removes it all


def ms(x):
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def interrupted(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=FAULTS)
    parser.add_argument("--tools", default=TOOLS,
                        help="fluidctl (its runtime's script), fluidctl-torch (the torch script "
                             "torchrun runs, unmodified, under fluidctl train), torchrun")
    parser.add_argument("--warm", type=int, default=15)
    parser.add_argument("--window", type=float, default=40.0,
                        help="seconds each tool is watched after the fault")
    args = parser.parse_args()
    unknown = set(args.faults.split(",")) - set(FAULTS.split(","))
    if unknown:
        sys.exit(f"error: unknown fault {', '.join(sorted(unknown))} (one of {FAULTS})")
    why = netns.available()
    if why:
        sys.exit(f"error: namespace nodes cannot run here ({why})")
    for sig in (signal.SIGTERM, signal.SIGHUP):     # unwind through every finally: clean up
        signal.signal(sig, interrupted)
    import torch
    from torch.distributed import constants
    rows = []
    for fault in args.faults.split(","):
        for tool in args.tools.split(","):
            row = one(tool, fault, args.warm, args.window)
            rows.append(row)
            print(f"{fault:8} {tool:14} after {row['after_s'] and round(row['after_s'], 1)} s: "
                  f"{row['said'] or f'nothing within {args.window:g} s'} "
                  + (f"/ {row['why']} " if row["why"] else "") +
                  f"(step {ms(row['step_before'])} -> {ms(row['step_after'])})", flush=True)
    print(f"\ntorch {torch.__version__}; gloo's default collective timeout "
          f"{constants.default_pg_timeout}")
    tools = args.tools.split(",")
    print("| fault | " + " | ".join(f"{t} says | after" for t in tools) +
          f" | step time before -> after ({'; '.join(tools)}) |")
    print("|---|" + "---|---|" * len(tools) + "---|")
    for fault in args.faults.split(","):
        got = {r["tool"]: r for r in rows if r["fault"] == fault}
        cells = [fault]
        for tool in tools:
            r = got.get(tool)
            if r is None:
                cells += ["-", "-"]
                continue
            said = r["said"] + (f" / {r['why']}" if r["why"] else "") if r["said"] else ""
            cells += [f"`{said}`" if said else f"nothing within {args.window:g} s",
                      f"{r['after_s']:.1f} s" if r["said"] else "-"]
        cells.append("; ".join(f"{ms(got[t]['step_before'])} -> {ms(got[t]['step_after'])}"
                               for t in tools if t in got))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as exc:
        sys.exit(f"interrupted ({exc or 'SIGINT'}): the nodes of the fault under way were removed")
