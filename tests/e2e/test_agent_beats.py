"""An elastic job's node agent hears the launcher's beats from its first moment, whatever its
main thread is doing: importing the supervisor and starting ranks takes seconds on a node
busy with a hundred agents, and an agent that read stdin only between those steps missed
beats it had been sent and stopped its own node. The agent here compiles every module it imports
(no bytecode cache: a node right after `cluster sync`), so its imports take longer than the
beats it may miss, while that window stays wider than a loaded machine's scheduling gaps."""
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from fluidctl.agentproto import NodeShare
from fluidctl.node.agent import GONE_MARGIN
from fluidctl.planning.plan import ProcSpec
from launchutil import wait_for

BEAT = 0.05     # the agent stops after 6 beats unheard: 0.3 s, less than its imports take


def test_an_agent_busy_starting_still_hears_the_launchers_beats(tmp_path):
    uncached = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                    PYTHONPYCACHEPREFIX=str(tmp_path / "no-bytecode"))
    agent = subprocess.Popen([sys.executable, "-m", "fluidctl.node.agent", "--ports", "1",
                              "--beat", str(BEAT)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=uncached)
    stop = threading.Event()

    def beats():
        while not stop.wait(BEAT / 2):
            try:
                agent.stdin.write(b"beat\n")
                agent.stdin.flush()
            except (BrokenPipeError, ValueError):
                return
    feeder = threading.Thread(target=beats, daemon=True)
    feeder.start()
    try:
        line = agent.stdout.readline()
        while line and b"probe|" not in line:      # its own beats come first
            line = agent.stdout.readline()
        assert line, "the agent ended before its probe"   # it is up, and importing
        drain = threading.Thread(target=agent.stdout.read, daemon=True)   # its beats
        drain.start()
        time.sleep(2.0)                            # the launcher plans for a while, beating
        stop.set()
        feeder.join()
        agent.stdin.write(b"\n")                   # no plan for this node: exit quietly
        agent.stdin.flush()
        err = agent.stderr.read()
        agent.wait(60)
    finally:
        stop.set()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, err.decode()[-2000:]
    assert b"no heartbeat from the launcher" not in err


# 800 KB of output at once (a pipe holds 64 KB), then quiet: the machine stays idle meanwhile
CHATTY = "import time\nfor _ in range(4000):\n    print('x' * 200)\ntime.sleep(600)\n"


@pytest.mark.parametrize("gone", ["silent", "stdin closed"])
def test_an_agent_whose_stdout_nobody_reads_still_ends_when_its_launcher_is_gone(tmp_path, gone):
    """Its SSH connection stalled (a link down, a frozen launcher): nothing drains its stdout,
    and a rank that prints fills the pipe, so the agent blocks in a write, the supervisor's
    stop included. It must still end, and its rank with it: at the latest GONE_MARGIN
    seconds past the grace period (node/agent.py, ``launcher_gone``)."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    rank = ProcSpec("trainer", 0, 0, 0, "127.0.0.1", "127.0.0.1:6170", [],
                    [sys.executable, "-u", str(tmp_path / "chatty.py")], {},
                    str(tmp_path / "log" / "workerlog.0"))
    share = NodeShare([rank.to_json()], str(tmp_path / "log"), "127.0.0.1", grace=1.0,
                      beat=BEAT * 4)
    agent = subprocess.Popen([sys.executable, "-m", "fluidctl.node.agent", "--beat",
                              str(BEAT * 4)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(tmp_path / "agent.err", "wb"), cwd=tmp_path)
    try:
        line = agent.stdout.readline()
        while line and b"probe|" not in line:
            line = agent.stdout.readline()
        agent.stdin.write((share.to_wire() + "\n").encode())
        agent.stdin.flush()
        ranks = wait_for(lambda: [p for p in psutil.Process(agent.pid).children(True)
                                  if "chatty.py" in " ".join(p.cmdline())], 30, "the rank")

        def blocked():          # the pipe is full: the agent's output stopped growing
            agent.stdin.write(b"beat\n")
            agent.stdin.flush()
            return len((tmp_path / "log").glob("**/workerlog.0").__next__().read_bytes()) \
                > 200_000
        wait_for(blocked, 60, "the rank's output well past what a pipe holds")
        if gone == "stdin closed":
            agent.stdin.close()
        began = time.monotonic()
        agent.wait(share.grace + GONE_MARGIN + 30)
        took = time.monotonic() - began
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    err = (tmp_path / "agent.err").read_text()
    assert agent.returncode is not None and took < share.grace + GONE_MARGIN + 30, err
    psutil.wait_procs(ranks, timeout=10)
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], err
