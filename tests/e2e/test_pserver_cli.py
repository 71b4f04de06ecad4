"""`fluidctl pserver start|status|stop` as a user runs them (real processes, a private state
directory)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from fluidctl.runtime import optim
import pserverutil as local
from fluidctl.runtime.pserver.client import PServerOptimizer


@pytest.fixture
def cli(tmp_path):
    env = dict(os.environ, FLUIDCTL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    env.pop("FLUIDCTL_JOB_TOKEN", None)
    started = []

    def run(*args, check=None):
        proc = subprocess.run([sys.executable, "-m", "fluidctl", "pserver", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc
    run.env, run.state, run.started = env, tmp_path / "state", started
    yield run
    for pid in started:                    # a failed test must not leave daemons behind
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _status(cli):
    return json.loads(cli("status", "--json", check=0).stdout)


def _wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_daemon_start_status_stop(cli, tmp_path):
    port, = local.free_ports(1)
    out = cli("start", "--port", str(port), "--num_gradient_servers", "1", "--daemon",
              "--checkpoint-dir", str(tmp_path / "ckpt"), check=0)
    assert f"pserver started: 127.0.0.1:{port}" in out.stdout
    token_file = cli.state / f"pserver-{port}.token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    (record,) = _status(cli)
    cli.started.append(record["pid"])
    assert record["state"] == "running" and record["port"] == port
    assert (cli.state / f"pserver-{port}.pid").read_text().strip() == str(record["pid"])
    assert psutil.Process(record["pid"]).ppid() != os.getpid()      # detached

    params = {"w": np.ones(10, np.float32)}
    opt = PServerOptimizer(params, optimizer=optim.SGD(0.5), endpoints=[f"127.0.0.1:{port}"],
                           trainer_id=0, token=token_file.read_text().strip())
    opt.step({"w": np.ones(10, np.float32)})
    _wait_until(lambda: _status(cli)[0]["trainers_connected"] == [0])
    record = _status(cli)[0]
    assert (record["params"], record["bytes"], record["step"]) == (1, 40, 1)
    table = cli("status", check=0).stdout
    assert f"127.0.0.1:{port}" in table and "running" in table and "1/1" in table

    again = cli("start", "--port", str(port), "--daemon", check=2)
    assert again.stderr.startswith("error: a pserver already runs on port")
    assert len(again.stderr.strip().splitlines()) == 1

    opt.close()
    stopped = cli("stop", "--port", str(port), check=0)
    assert "stopped" in stopped.stdout and "kept" not in stopped.stdout
    assert not psutil.pid_exists(record["pid"]) or psutil.Process(
        record["pid"]).status() == psutil.STATUS_ZOMBIE
    assert _status(cli) == []
    assert sorted(p.name for p in cli.state.iterdir()) == []   # token, log, pid file: gone
    manifest = json.loads((tmp_path / "ckpt" / "pserver.0" / "manifest.json").read_text())
    assert manifest["step"] == 1                              # SIGTERM saved the shard


def test_a_killed_daemon_shows_dead_and_stop_all_cleans_up(cli):
    port, = local.free_ports(1)
    cli("start", "--port", str(port), "--daemon", check=0)
    (record,) = _status(cli)
    cli.started.append(record["pid"])
    os.kill(record["pid"], signal.SIGKILL)
    _wait_until(lambda: _status(cli)[0]["state"] == "dead")
    assert "dead" in cli("status", check=0).stdout
    log = cli.state / f"pserver-{port}.log"
    stopped = cli("stop", "--all", check=0).stdout
    assert f"stale record removed; its log: {log})" in stopped
    assert _status(cli) == []
    assert not (cli.state / f"pserver-{port}.token").exists()      # no server, no secret
    assert "serving" in log.read_text()                            # the evidence stays


def test_a_daemon_ended_by_a_plain_kill_takes_its_generated_token_along(cli, tmp_path):
    port, = local.free_ports(1)
    cli("start", "--port", str(port), "--daemon", check=0)
    (record,) = _status(cli)
    cli.started.append(record["pid"])
    token = cli.state / f"pserver-{port}.token"
    assert token.exists()
    os.kill(record["pid"], signal.SIGTERM)
    _wait_until(lambda: not psutil.pid_exists(record["pid"])
                or psutil.Process(record["pid"]).status() == psutil.STATUS_ZOMBIE)
    assert _status(cli) == []
    assert not token.exists()
    # a token the user gave in the state dir under another name is theirs: never touched
    mine = cli.state / "mine.token"
    mine.write_text("a-token-of-the-users\n")
    port, = local.free_ports(1)
    cli("start", "--port", str(port), "--daemon", "--token-file", str(mine), check=0)
    (record,) = _status(cli)
    cli.started.append(record["pid"])
    os.kill(record["pid"], signal.SIGTERM)
    _wait_until(lambda: _status(cli) == [])
    assert mine.read_text() == "a-token-of-the-users\n"


def test_a_stop_whose_last_checkpoint_failed_keeps_the_log(cli, tmp_path):
    port, = local.free_ports(1)
    ckpt = tmp_path / "ckpt"
    cli("start", "--port", str(port), "--daemon", "--checkpoint-dir", str(ckpt), check=0)
    (record,) = _status(cli)
    cli.started.append(record["pid"])
    import shutil
    shutil.rmtree(ckpt)
    ckpt.write_text("not a directory any more\n")      # the checkpoint on SIGTERM fails
    stopped = cli("stop", "--port", str(port), check=0).stdout
    log = cli.state / f"pserver-{port}.log"
    assert f"it logged warnings or errors, its log is kept: {log}" in stopped
    assert "checkpoint at step 0 failed" in log.read_text()
    assert not (cli.state / f"pserver-{port}.token").exists()


# `fluidctl pserver start --daemon`, run from a child subreaper that never reaps: the daemon
# is its orphan, and once it exits stays a zombie (as under an init that reaps late)
NO_REAPER = """
import ctypes, subprocess, sys, time
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0      # PR_SET_CHILD_SUBREAPER
start = subprocess.run([sys.executable, "-m", "fluidctl", "pserver", "start", "--port",
                        sys.argv[1], "--daemon"], capture_output=True, text=True)
print(start.returncode, start.stderr.strip(), flush=True)
time.sleep(120)
"""


def test_a_stopped_daemon_that_nobody_reaps_counts_as_stopped(cli, tmp_path):
    """A daemon's exit is its reaper's to collect (init, or a subreaper), which may be late or
    never come: ``stop`` takes a zombie for the exit it is, not for a server that runs on."""
    port, = local.free_ports(1)
    holder = subprocess.Popen([sys.executable, "-c", NO_REAPER, str(port)], env=cli.env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().startswith("0 "), "the daemon did not start"
        (record,) = _status(cli)
        cli.started.append(record["pid"])
        stopped = cli("stop", "--port", str(port), "--timeout", "20", check=0).stdout
        assert f"stopped (pid {record['pid']})" in stopped
        assert psutil.Process(record["pid"]).status() == psutil.STATUS_ZOMBIE
        assert _status(cli) == []
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_start_errors_are_one_line(cli, tmp_path):
    busy = socket.create_server(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    try:
        failed = cli("start", "--host", "127.0.0.1", "--port", str(port), "--daemon", check=2)
        assert "did not start: cannot listen on 127.0.0.1" in failed.stderr
        foreground = cli("start", "--host", "127.0.0.1", "--port", str(port), check=2)
        assert foreground.stderr.startswith("error: cannot listen on")
    finally:
        busy.close()
    for args, message in [
        (("start", "--token-file", str(tmp_path / "missing")), "cannot read token file"),
        (("start", "--port", "0", "--daemon"), "--daemon needs a fixed port"),
        (("start", "--ports_num", "0"), "--ports_num"),
        (("stop",), "say which pservers to stop"),
        (("stop", "--port", "9"), "no pserver on port 9"),
    ]:
        proc = cli(*args, check=2)
        assert proc.stderr.startswith("error:") and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_foreground_server_exits_0_on_sigterm_with_a_checkpoint(cli, tmp_path):
    port, = local.free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "pserver", "start", "--port",
                             str(port), "--checkpoint-dir", str(tmp_path / "ck")],
                            env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    cli.started.append(proc.pid)
    _wait_until(lambda: (cli.state / f"pserver-{port}.json").exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert (tmp_path / "ck" / "pserver.0" / "manifest.json").exists()
    assert not (cli.state / f"pserver-{port}.json").exists()
