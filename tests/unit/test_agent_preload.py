"""The node agent answers the launcher's rendezvous check while its run's modules load
(fluidctl/node/agent.py, fluidctl/preload.py): the check is on the path to every rank, the
imports (28 ms) need not be."""
import json
import os
import subprocess
import sys
import threading

from fluidctl.agentproto import DOCTOR_TAG, MARK, PROBE_TAG
from launchutil import HELD_AGENT as HELD



def _line(proc, tag, timeout=30.0) -> str:
    """The agent's next line tagged ``tag`` (None after ``timeout``)."""
    found = []

    def read():
        for line in proc.stdout:
            if line.startswith(f"{MARK}{tag}|"):
                found.append(line.split("|", 1)[1])
                return
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


def test_the_rendezvous_check_is_answered_while_the_run_modules_load(tmp_path):
    hold = tmp_path / "hold"
    proc = subprocess.Popen([sys.executable, "-c", HELD, str(hold), "--ports", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert _line(proc, PROBE_TAG) is not None, proc.stderr.read() if proc.poll() else ""
        proc.stdin.write(json.dumps({"doctor": {"address": "127.0.0.1", "ports": []}}) + "\n")
        proc.stdin.flush()
        # answered though fluidctl.launch.run has not finished importing
        assert _line(proc, DOCTOR_TAG, timeout=20.0) == "[]\n"
        assert not hold.exists()
        hold.write_text("")
        proc.stdin.write("\n")          # no plan: the agent exits quietly
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def test_the_agent_leaves_at_once_with_its_output_flushed():
    """``leave``: os._exit after flushing (no interpreter teardown: 7 ms, and where daemon
    threads can crash an agent); what was written, block-buffered into a pipe, still arrives,
    and atexit handlers do not run (none is registered in an agent)."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "from fluidctl.node import agent\n"
            "sys.stdout.write('last record')\n"
            "agent.leave(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONUNBUFFERED": ""})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "last record"
