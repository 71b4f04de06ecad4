"""The health gate and the bad-node ledger on eight namespace nodes (tests/netns.py; root):
node3's CPU throttled to a tenth of a core (cgroup cpu quota), node6's link capped at 10 mbit/s
(tc tbf); then ``cluster check --deep``, ``train --health-gate --nodes 6``, ``cluster ledger
list``, the next ``train`` (ledgered nodes left out), one asking for too many nodes,
``--include-bad``, ``cluster ledger clear``. Prints the transcript (stderr and stdout
interleaved as on a terminal) with each command's exit code and wall time.

    python bench/health_gate.py

Every node's cpu cgroup gets cpu.shares 262144, so the rest of this machine's load does not
decide the CPU figures (nodes sharing two cores); the quota still caps node3.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import netns  # noqa: E402

HELLO = ROOT / "templates" / "hello.py"


def main() -> int:
    why = netns.available()
    if why:
        print(f"cannot make namespace nodes here: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fluidctl-health-") as tmp:
        work = Path(tmp)
        nodes = netns.NetnsNodes.start(work / "nodes", 8)
        env = dict(os.environ, FLUIDCTL_STATE_DIR=str(work / "state"), COLUMNS="200")
        names = {str(nodes.hostfile()): "hosts", str(nodes.config): "ssh.cfg",
                 str(HELLO): "templates/hello.py"}

        def run(*args) -> None:
            shown = " ".join(names.get(str(a), str(a)) for a in args)
            print(f"$ fluidctl {shown}", flush=True)
            started = time.monotonic()
            res = subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                                 cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
            print(res.stdout, end="")
            print(f"[exit {res.returncode}, {time.monotonic() - started:.1f} s]\n", flush=True)
        try:
            for alias in nodes.nodes:
                (nodes._cgroup(alias, netns.CPU) / "cpu.shares").write_text("262144")
            nodes.throttle_cpu("node3", 0.1)
            nodes.cap_link("node6", "10mbit")
            hosts = ["--hostfile", nodes.hostfile(), "--ssh-config", nodes.config]
            run("cluster", "check", "--deep", *hosts)
            run("train", *hosts, "--health-gate", "--nodes", 6, HELLO)
            run("cluster", "ledger", "list")
            run("train", *hosts, "--nodes", 6, HELLO)
            run("train", *hosts, "--nodes", 7, HELLO)
            run("train", *hosts, "--nodes", 7, "--include-bad", HELLO)
            run("cluster", "ledger", "clear", "node3")
        finally:
            nodes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
