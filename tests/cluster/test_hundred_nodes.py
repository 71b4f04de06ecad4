"""A job on 100 nodes: 100 real sshd servers on loopback addresses (127.0.20.x), one rank
each. It starts, loses a node and finishes: node 0's rendezvous check lets every node through
(a master port that only listened let 65 through and refused the job with false "cannot reach
the master" lines), and the 99 others go on in a new world.

The node agents all share this machine's two cores, so the per-node answer deadline is
raised (each real node starts its agent on its own CPU)."""
import os
import re
import signal
import time
from pathlib import Path

import pytest

from launchutil import wait_for
from sshd import SSHNodes

NODES = 100
SCRIPT = """\
import os, sys, time
rank, world = os.environ["PADDLE_TRAINER_ID"], os.environ["PADDLE_TRAINERS_NUM"]
attempt = os.environ["PADDLE_RESTART_COUNT"]
print(f"rank {rank} of {world} attempt {attempt}", flush=True)
if attempt == "0":
    deadline = time.monotonic() + 300          # world 0 runs until a node is lost
    while time.monotonic() < deadline and not os.path.exists(sys.argv[1]):
        time.sleep(0.2)
"""


@pytest.fixture
def hundred(tmp_path):
    why = SSHNodes.available()
    if why:
        pytest.skip(why)
    addresses = {f"h{i}": f"127.0.20.{1 + i}" for i in range(NODES)}
    nodes = SSHNodes.start(tmp_path / "ssh", addresses)
    yield nodes
    nodes.stop()


def started(logs: Path, attempt: str) -> int:
    count = 0
    for log in logs.glob("h*/workerlog.*"):
        try:
            count += f"attempt {attempt}" in log.read_text()
        except OSError:
            pass
    return count


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _start(tmp_path, hundred, stop_file):
    import subprocess
    import sys
    out = open(tmp_path / "launcher.out", "w")
    # the 100 nodes' agents and ranks share this host's cores: starting 100 standby agents, or
    # 99 ranks at the restart, keeps healthy agents from beating for seconds, which on real
    # nodes (a core each) would not happen; so heartbeats may be missed for 60 s (the victim
    # is lost at once all the same: its agent's end closes its connection)
    env = dict(os.environ, FLUIDCTL_HEARTBEAT_TIMEOUT="60")
    try:
        return subprocess.Popen([sys.executable, "-m", "fluidctl", "train", "--hostfile",
                                 hundred.hostfile(slots=1), "--ssh-config", hundred.config,
                                 "--ssh-timeout", "240", "--nodes", f"95:{NODES}",
                                 "--max-restarts", "1", "job.py", str(stop_file)],
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        out.close()


@pytest.mark.alone        # its 300 processes would starve every test beside it
def test_a_100_node_job_starts_loses_a_node_and_finishes_on_bounded_launcher_threads(
        tmp_path, hundred):
    """100 nodes start (node 0's rendezvous check lets every one through) under --nodes
    95:100. While world 0 runs, the launcher holds paramiko's one transport thread per
    connection and a fixed number besides: every agent's output and end are watched from one
    event loop, not from three threads of its own. Then one node's agent is killed: the node
    is lost at once, the other 99 get a new world from the standby agents, and the job ends
    with 0 and no agent left behind. One job for all of it (a 100-node job is the suite's
    costliest)."""
    (tmp_path / "job.py").write_text(SCRIPT)
    stop_file = tmp_path / "never"
    logs = tmp_path / "mylog"
    said = lambda: (tmp_path / "launcher.out").read_text()      # noqa: E731
    launched = time.monotonic()
    proc = _start(tmp_path, hundred, stop_file)
    try:
        wait_for(lambda: started(logs, "0") == NODES or proc.poll() is not None, 400,
                 "every rank of world 0 to start")
        if proc.poll() == 2 and re.search(r"port \S+ \(trainer \d+'s endpoint\) is in use",
                                          said()):
            # the rendezvous check found a port that another test's process (a torch store on
            # 0.0.0.0) took after this job reserved it: nothing was started; as a user would,
            # run it again (200 ports of one host in a suite that binds wildcard ports beside it)
            launched = time.monotonic()
            proc = _start(tmp_path, hundred, stop_file)
            wait_for(lambda: started(logs, "0") == NODES or proc.poll() is not None, 400,
                     "every rank of world 0 to start")
        up = time.monotonic() - launched
        assert proc.poll() is None, said()[-3000:]
        # the restart hands plans to the standby agents started while world 0 runs: on real
        # nodes they are up in a second or two, here 100 of them share two cores for a while
        wait_for(lambda: "standby agents ready on 100 of 100" in
                 (logs / "launch.log").read_text() or proc.poll() is not None, 400,
                 "the standby agents to be ready")
        most = 0
        for _ in range(20):                 # steady state: every node's job and standby up
            most = max(most, threads_of(proc.pid))
            time.sleep(0.1)
        victim = "h57"
        pids = hundred.agent_pids(victim)
        assert pids, "no agent on the victim node"
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: started(logs, "1") == NODES - 1 or proc.poll() is not None, 400,
                 "every rank of world 1 to start")
        took = time.monotonic() - killed
        assert proc.wait(300) == 0, said()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = said()
    print(f"world 0's {NODES} ranks all started {up:.1f}s after the launch; launcher threads: "
          f"{most}; node killed: world 1's {NODES - 1} ranks all started {took:.1f}s later")
    assert "cannot reach the master" not in out
    assert f"node {victim} lost" in out, out[-3000:]
    assert re.search(r"restart 1: new world of 99 trainer\(s\)", out), out[-3000:]
    assert started(logs, "1") == NODES - 1
    for alias in hundred.aliases:
        assert hundred.agent_pids(alias) == [], f"an agent outlived the job on {alias}"
    assert most <= NODES + 30, f"{most} threads for {NODES} nodes"
