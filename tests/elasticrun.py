"""Elastic jobs on namespace nodes (tests/netns.py) under real faults, for tests/cluster/
test_elastic.py and bench/elastic.py: start ``fluidctl train --nodes MIN:MAX`` with
tests/scripts/elastic_train.py, inject faults at given steps, and measure, from the fault, when
the launcher declared the node lost (its launch.log line) and when the new world completed its
first step (the script's progress.log); then check the weights against the reference for the
world sequence the job really ran, and that every node holds nothing but sshd afterwards."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import psutil

from launchutil import ROOT, wait_for

SCRIPT = ROOT / "tests" / "scripts" / "elastic_train.py"
sys.path.insert(0, str(SCRIPT.parent))
import elastic_train  # noqa: E402


def running(nodes, alias: str, needle: str) -> List[int]:
    """The node's processes whose command line holds ``needle``."""
    found = []
    for pid in nodes.pids(alias):
        try:
            if needle in " ".join(psutil.Process(pid).cmdline()):
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def kill_matching(nodes, alias: str, needle: str) -> None:
    for pid in running(nodes, alias, needle):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_agent(nodes, alias: str) -> None:
    """SIGKILL the node's fluidctl agent (its ranks and sshd stay; the parent-death signal
    and lifeline end the ranks)."""
    kill_matching(nodes, alias, "fluidctl.node.agent")


FAULTS = {"agent-kill": kill_agent,
          "link-down": lambda nodes, alias: nodes.link_down(alias),
          "freeze": lambda nodes, alias: nodes.freeze(alias)}


def heal(nodes, kind: str, alias: str) -> None:
    if kind == "link-down":
        nodes.link_up(alias)
    elif kind == "freeze":
        nodes.thaw(alias)


@dataclass
class Fault:
    at_step: int                    # injected once the running world completed this step
    kind: str                       # FAULTS
    aliases: Tuple[str, ...]        # "master": the node that holds MASTER_ADDR now
    during_restart: bool = False    # injected as soon as the fault before it was detected,
    #                                 at_step not waited for: the restart is under way
    heal_after: float = 0.0         # healed this many seconds after it was detected (0: at
    #                                 the end of the job)
    when: float = 0.0
    hit: Tuple[str, ...] = ()
    step: Optional[int] = None              # the last step rank 0 logged when it was injected
    #                                         (a busy machine injects it a step or two late)
    detected: Optional[float] = None        # seconds from the fault to "lost" in launch.log
    first_step: Optional[float] = None      # seconds from the fault to the new world's step


@dataclass
class Outcome:
    code: int
    out: str
    faults: List[Fault]
    worlds: List[int]                   # the world size that ran each step, last run wins
    starts: List[str] = field(default_factory=list)
    weights: Optional[list] = None
    reference: Optional[list] = None
    leftovers: Dict[str, List[str]] = field(default_factory=dict)


def progress(ckpt: Path) -> List[str]:
    try:
        return (ckpt / "progress.log").read_text().splitlines()
    except FileNotFoundError:
        return []


def last_step(ckpt: Path) -> int:
    steps = [int(line.split()[1]) for line in progress(ckpt) if line.startswith("step ")]
    return steps[-1] if steps else 0


def master_alias(ckpt: Path, nodes) -> str:
    starts = [line for line in progress(ckpt) if line.startswith("start ")]
    addr = starts[-1].split(" master ")[1].split()[0]
    return next(a for a, n in nodes.nodes.items() if n.address == addr)


def busy(nodes, alias: str) -> subprocess.Popen:
    """A process spinning at 100% of a CPU inside the node (its namespace and cgroups)."""
    node = nodes.node(alias)
    proc = subprocess.Popen(["ip", "netns", "exec", node.netns, sys.executable, "-c",
                             "while True: pass"])
    for cgroup in node.cgroups:
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
    return proc


def run_elastic(nodes, work: Path, *, node_range: str, faults: List[Fault], steps: int = 30,
                pause: float = 0.05, max_restarts: int = 3, timeout: float = 120.0,
                env: Optional[dict] = None, loaded: Tuple[str, ...] = (),
                backend: str = "ssh") -> Outcome:
    """``loaded``: nodes kept at 100% CPU (a busy process each) for the whole job."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "ckpt"
    ckpt.mkdir()
    hostfile = nodes.hostfile("hosts.elastic")
    launch_log = work / "mylog" / "launch.log"
    argv = [sys.executable, "-m", "fluidctl", "train", "--backend", backend, "--hostfile",
            str(hostfile), "--ssh-config", str(nodes.config), "--nodes", node_range,
            "--max-restarts", str(max_restarts), "--grace-period", "1", "--log-dir",
            str(work / "mylog"), str(SCRIPT), str(steps), str(ckpt), str(pause),
            ",".join(str(f.at_step) for f in faults if not f.during_restart)]
    full_env = dict(os.environ, FLUIDCTL_STATE_DIR=str(work / "state"), **(env or {}))
    hogs = [busy(nodes, alias) for alias in loaded]
    proc = subprocess.Popen(argv, cwd=work, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for fault in faults:
            if not fault.during_restart:
                wait_for(lambda: last_step(ckpt) >= fault.at_step or proc.poll() is not None,
                         timeout, f"step {fault.at_step}")
            if proc.poll() is not None:
                break
            fault.hit = tuple(master_alias(ckpt, nodes) if a == "master" else a
                              for a in fault.aliases)
            for alias in fault.hit:
                FAULTS[fault.kind](nodes, alias)
            fault.when = time.time()
            fault.step = last_step(ckpt)
            if not fault.during_restart:        # the ranks held after its step: go on
                (ckpt / f"go.{fault.at_step}").write_text("")

            def lost():         # the launcher's first word of it (launch.log)
                text = launch_log.read_text() if launch_log.exists() else ""
                return all(re.search(rf"node {a} (declared lost|\(pid \d+\) ended)", text)
                           for a in fault.hit) or proc.poll() is not None
            wait_for(lost, timeout, f"{fault.hit} declared lost")
            fault.detected = time.time() - fault.when
            if fault.heal_after:
                time.sleep(fault.heal_after)        # the fault itself lasts this long
                for alias in fault.hit:
                    heal(nodes, fault.kind, alias)
        out, _ = proc.communicate(timeout=timeout)
        (work / "console.txt").write_text(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for hog in hogs:
            hog.kill()
            hog.wait()
        for fault in faults:
            for alias in fault.hit:
                heal(nodes, fault.kind, alias)
    worlds: Dict[int, int] = {}
    for line in progress(ckpt):
        if line.startswith("step "):
            worlds[int(line.split()[1])] = int(line.split()[3])
    outcome = Outcome(proc.returncode, out, faults,
                      [worlds.get(s, 0) for s in range(1, steps + 1)],
                      [line for line in progress(ckpt) if line.startswith("start ")])
    for fault in faults:
        fault.first_step = first_step_after(progress(ckpt), fault.when)
    if (ckpt / "final.json").exists():
        import json
        outcome.weights = json.loads((ckpt / "final.json").read_text())["w"]
    if 0 not in outcome.worlds:
        outcome.reference = elastic_train.reference(outcome.worlds)
    outcome.leftovers = leftovers(nodes)
    for alias in outcome.leftovers:     # what the node's agents said (their launch.log tails)
        address = nodes.node(alias).address
        for log in sorted((work / "mylog").glob("*/launch.log")):
            if log.parent.name in (alias, address):
                outcome.leftovers[alias].append(
                    f"{log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return outcome


def first_step_after(lines: List[str], when: float) -> Optional[float]:
    """Seconds from ``when`` to the first step of the first world that started after it."""
    started = False
    for line in lines:
        t = float(line.split(" t ")[1])
        started = started or (line.startswith("start ") and t > when)
        if started and line.startswith("step "):
            return t - when
    return None


def described(pid: int) -> str:
    """What a leftover process is, for the failure message: its state, parent, command, and a
    Python process's threads (py-spy, where installed)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            text = (f"{pid} {proc.name()}: {proc.status()}, parent {proc.ppid()}, "
                    f"{' '.join(proc.cmdline())[:160]}")
    except psutil.Error:
        return f"{pid} gone"
    if "python" in text and shutil.which("py-spy"):
        try:
            dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True,
                                  text=True, timeout=20)
            text += "\n" + (dump.stdout or dump.stderr)[-3000:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            text += f" (py-spy: {exc})"
    return text


def not_sshd(nodes, alias: str) -> List[int]:
    found = []
    for pid in nodes.pids(alias):
        try:
            name = psutil.Process(pid).name()
        except psutil.NoSuchProcess:
            continue
        if name != "sshd":
            found.append(pid)
    return found


def leftovers(nodes, timeout: float = 30.0) -> Dict[str, List[str]]:
    """Every node's processes other than sshd, once they had ``timeout`` to end (a healed
    node's agent notices the launcher is gone and stops its ranks: within the grace period,
    at the latest GONE_MARGIN seconds later, node/agent.py), each described."""
    def left():
        found = {a: not_sshd(nodes, a) for a in nodes.nodes}
        return {a: p for a, p in found.items() if p}
    try:
        wait_for(lambda: not left(), timeout, "only sshd on every node")
    except AssertionError:
        pass
    return {alias: [described(pid) for pid in pids] for alias, pids in left().items()}
