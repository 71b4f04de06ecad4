"""A real elastic job on many nodes: N sshd servers on loopback addresses (127.0.20.x), one
rank each, `fluidctl train --nodes N-5:N`; then one node's agent is SIGKILLed.

    python bench/hundred_nodes.py [--nodes 100]

Prints the seconds from the launch until every rank of world 0 ran, the launcher's threads
meanwhile, and from the kill until the new world was planned and until its N-1 ranks all ran.
The job is tests/cluster/test_hundred_nodes.py's (which asserts what this only times). Every
node shares this machine's cores, so heartbeats may be missed for 60 s (a node's own core keeps
its agent beating on a real cluster); the killed node is lost at once all the same.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "cluster")]

from launchutil import wait_for  # noqa: E402
from sshd import SSHNodes  # noqa: E402
from test_hundred_nodes import SCRIPT, started, threads_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100, help="nodes (at most 250), e.g. 100")
    args = ap.parse_args()
    why = SSHNodes.available()
    if why:
        raise SystemExit(why)
    n = args.nodes
    work = Path(tempfile.mkdtemp(prefix="fluidctl-bench-nodes-"))
    nodes = SSHNodes.start(work / "ssh", {f"h{i}": f"127.0.20.{1 + i}" for i in range(n)})
    (work / "job.py").write_text(SCRIPT)
    logs, out = work / "mylog", open(work / "launcher.out", "w")
    env = dict(os.environ, FLUIDCTL_HEARTBEAT_TIMEOUT="60", FLUIDCTL_STATE_DIR=str(work / "st"))
    launched = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "train", "--hostfile",
                             nodes.hostfile(slots=1), "--ssh-config", nodes.config,
                             "--ssh-timeout", "240", "--nodes", f"{max(1, n - 5)}:{n}",
                             "--max-restarts", "1", "job.py", str(work / "never")],
                            cwd=work, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: started(logs, "0") == n, 600, "every rank of world 0 to start")
        up = time.monotonic() - launched
        wait_for(lambda: f"standby agents ready on {n} of {n}" in
                 (logs / "launch.log").read_text(), 600, "the standby agents")
        threads = max(threads_of(proc.pid) for _ in range(5))
        victim = f"h{n // 2}"
        killed = time.monotonic()
        for pid in nodes.agent_pids(victim):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: re.search(r"restart 1: new world",
                                   (logs / "launch.log").read_text()), 600, "the new world")
        planned = time.monotonic() - killed
        wait_for(lambda: started(logs, "1") == n - 1, 600, "every rank of world 1 to start")
        running = time.monotonic() - killed
        code = proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        nodes.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{n} nodes: world 0 running {up:.1f} s after the launch ({threads} launcher threads); "
          f"a node's agent killed: new world planned {planned:.1f} s, its {n - 1} ranks running "
          f"{running:.1f} s after the kill; exit code {code}")


if __name__ == "__main__":
    main()
