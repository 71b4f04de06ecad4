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
