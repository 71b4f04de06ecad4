"""Issue 27 (hardening): every blocking network call has a deadline, nothing fluidctl started
outlives it, promised checkpoints are written before anything is killed, and unauthenticated
peers cannot fill the disk. Real processes and sockets on loopback, cleaned up by pid."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluidctl import envs
import pserverutil as local
from launchutil import ROOT, wait_for

TOKEN = "hardening-27-token"

PS_LOOP = r'''
import os, sys, time
from pathlib import Path
import numpy as np
from fluidctl import envs
from fluidctl.runtime import optim
from fluidctl.runtime.pserver.client import PServerOptimizer

out, steps, slow = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
env = envs.read()
params = {"W": np.zeros((64, 64)), "b": np.zeros(64)}
opt = PServerOptimizer(params, optimizer=optim.SGD(0.1))
step = 0
while steps < 0 or step < steps:
    if step == 1 and env.rank == 1 and slow:
        time.sleep(slow)                  # trainer 0 waits in the sync round meanwhile
    opt.step({"W": np.ones((64, 64)), "b": np.ones(64)})
    step += 1
    (out / f"steps.{env.rank}").write_text(str(step))
opt.close()
print("done", flush=True)
'''


class PsJob:
    """One real pserver and ``trainers`` trainer processes running PS_LOOP."""

    def __init__(self, tmp: Path, trainers: int = 2):
        self.tmp, self.trainers = tmp, trainers
        self.endpoints = [f"127.0.0.1:{p}" for p in local.free_ports(1)]
        (tmp / "ps_loop.py").write_text(PS_LOOP)
        self.server = None
        self.workers = []

    def start_pserver(self, timeout: str):
        self.server = local.start_pserver(0, self.endpoints, self.trainers, token=TOKEN,
                                          log_path=str(self.tmp / "serverlog.0"),
                                          args=["--no-state"],
                                          extra_env={envs.TIMEOUT: timeout})

    def start_trainers(self, timeout: str, steps: int, slow: float = 0.0):
        for t in range(self.trainers):
            env = local.role_env(envs.ROLE_TRAINER, t, self.endpoints, self.trainers, True,
                                 TOKEN, {envs.TIMEOUT: timeout})
            with open(self.tmp / f"workerlog.{t}", "wb") as log:
                self.workers.append(subprocess.Popen(
                    [sys.executable, str(self.tmp / "ps_loop.py"), str(self.tmp), str(steps),
                     str(slow)], env=env, stdout=log, stderr=subprocess.STDOUT))

    def log(self, t: int) -> str:
        return (self.tmp / f"workerlog.{t}").read_text()

    def close(self):
        for p in self.workers:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.server is not None and self.server.poll() is None:
            os.kill(self.server.pid, signal.SIGCONT)
            self.server.kill()
            self.server.wait()


@pytest.fixture
def ps_job(tmp_path):
    jobs = []

    def make(**kw):
        jobs.append(PsJob(tmp_path, **kw))
        return jobs[-1]
    yield make
    for j in jobs:
        j.close()


def test_27_1_frozen_pserver_fails_trainers_within_timeout(ps_job):
    job = ps_job()
    job.start_pserver("30")
    job.start_trainers("2", steps=-1)
    wait_for(lambda: all((job.tmp / f"steps.{t}").exists() for t in range(2)), 30,
             "both trainers to complete a step")
    os.kill(job.server.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    for t, p in enumerate(job.workers):
        try:
            code = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"trainer {t} still blocked 20 s after the pserver froze:\n"
                        + job.log(t)[-2000:])
        assert code != 0
        text = job.log(t)
        assert f"pserver {job.endpoints[0]} did not answer within 2 s" in text, text[-2000:]
    assert time.monotonic() - stopped < 15


def test_27_1_sync_round_waiting_for_a_slow_trainer_outlives_the_deadline(ps_job):
    """The deadline is for a silent pserver: trainer 0 waits 5 s in a sync round for trainer 1
    with FLUIDCTL_TIMEOUT=2, and the pserver's keepalives carry it through."""
    job = ps_job()
    job.start_pserver("30")
    job.start_trainers("2", steps=3, slow=5.0)
    for t, p in enumerate(job.workers):
        assert p.wait(timeout=60) == 0, job.log(t)[-2000:]
        assert "done" in job.log(t)


# --- 27.3 / 27.4: kill -9 of the launcher ----------------------------------------------------

SETSID_RANK = r'''
import os, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
rank = os.environ.get("PADDLE_TRAINER_ID") or os.environ.get("OMPI_COMM_WORLD_RANK", "0")
child = subprocess.Popen(["setsid", "sleep", "997"])          # leaves the process group
(out / f"pids.{rank}.tmp").write_text(f"{os.getpid()} {child.pid}")
os.replace(out / f"pids.{rank}.tmp", out / f"pids.{rank}")
print("rank", rank, "ready", flush=True)
time.sleep(600)
'''


def _descendants(pid):
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid):
    from launchutil import alive
    return alive(pid)


def _start(args, cwd):
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-m", "fluidctl", *map(str, args)], cwd=cwd,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_27_3_kill_9_of_the_launcher_lets_pservers_checkpoint_first(tmp_path):
    (tmp_path / "ps_loop.py").write_text(PS_LOOP)
    ck = tmp_path / "ck"
    launcher = _start(["train", "--mode", "pserver", "--pservers", 1, "--nproc", 2,
                       "--checkpoint-dir", ck, "--log-dir", tmp_path / "log",
                       "--grace-period", 10, "--env", f"{envs.TIMEOUT}=30",
                       tmp_path / "ps_loop.py", tmp_path, -1, 0], tmp_path)
    seen = set()
    try:
        wait_for(lambda: all((tmp_path / f"steps.{t}").exists() for t in range(2)), 60,
                 "both trainers to complete a step")
        seen.update(_descendants(launcher.pid))
        launcher.kill()                             # kill -9: no goodbye
        launcher.wait()
        wait_for(lambda: not any(_alive(p) for p in seen), 20, "every process of the job to end")
        shard = ck / "pserver.0"
        names = sorted(p.name for p in shard.iterdir())
        assert "manifest.json" in names, names
        assert any(n.startswith("shard-") and n.endswith(".bin") for n in names), names
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_all(seen)


def _kill_9_and_see_every_process_end(launcher, tmp_path, start_within: float, what: str):
    """Once both ranks wrote their own and their setsid child's pids, SIGKILL the launcher:
    the ranks, the children and every other descendant (``what``) must end."""
    pids = []
    try:
        wait_for(lambda: all((tmp_path / f"pids.{r}").exists() for r in range(2)),
                 start_within, "both ranks to start their setsid child")
        for r in range(2):
            pids += [int(p) for p in (tmp_path / f"pids.{r}").read_text().split()]
        pids += _descendants(launcher.pid)
        launcher.kill()
        launcher.wait()
        wait_for(lambda: not any(_alive(p) for p in pids), 15, f"{what} {pids} to end")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_all(pids)


def test_27_4_kill_9_of_the_launcher_ends_a_ranks_setsid_child(tmp_path):
    (tmp_path / "rank.py").write_text(SETSID_RANK)
    launcher = _start(["train", "--nproc", 2, "--log-dir", tmp_path / "log",
                       tmp_path / "rank.py", tmp_path], tmp_path)
    _kill_9_and_see_every_process_end(launcher, tmp_path, 60,
                                      "the ranks and their setsid children")


@pytest.mark.skipif(not __import__("fluidctl.backends.mpi.launcher", fromlist=["available"]).available(),
                    reason="no Open MPI mpirun")
def test_27_4_kill_9_of_the_launcher_ends_mpiruns_whole_tree(tmp_path):
    (tmp_path / "rank.py").write_text(SETSID_RANK)
    launcher = _start(["train", "--backend", "mpi", "--nproc", 2, "--log-dir", tmp_path / "log",
                       tmp_path / "rank.py", tmp_path], tmp_path)
    # mpirun, its daemons, the ranks, their tees and their setsid children
    _kill_9_and_see_every_process_end(launcher, tmp_path, 90, "mpirun's whole tree")


# --- 27.5: a hang found ends as a hang, whatever the stack signal does to the ranks ----------

def test_27_5_hang_ends_as_a_hang_when_the_stack_signal_wakes_the_ranks(tmp_path):
    env = dict(os.environ, FLUIDCTL_PYSPY="")         # py-spy off: the faulthandler signal
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--nproc", "2",
                           "--hang-timeout", "2", "--log-dir", str(tmp_path / "log"),
                           str(ROOT / "tests" / "scripts" / "c_sleep_rank.py")],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 124, (proc.returncode, proc.stdout, proc.stderr)
    assert "the job hung" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    hangs = list((tmp_path / "log").glob("hang-*"))
    assert len(hangs) == 1 and (hangs[0] / "summary.txt").exists()
    report = __import__("json").loads((tmp_path / "log" / "failure.json").read_text())
    assert report["exit_code"] == 124 and report["hang"]


# --- 27.6: a flood of unauthenticated connections writes a bounded number of lines ----------

import re                                                    # noqa: E402
import socket                                                # noqa: E402

from fluidctl.runtime import wire                            # noqa: E402
from fluidctl.runtime.store import StoreClient               # noqa: E402

FLOOD = 2000
INTERVAL = 2.0                       # FLUIDCTL_DROP_LOG_INTERVAL in the servers under test

STORE_MAIN = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from fluidctl.runtime.store import StoreServer
server = StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.port, flush=True)
sys.stdin.read()
server.close()
"""


def _flood(port: int, n: int) -> None:
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            try:
                sock.recv(256)       # the server's hello, then its close
            except OSError:
                pass


_SUMMARY = re.compile(r"dropped (\d+) more connections? from 127\.0\.0\.1 in the last")


def _drop_lines(text: str, single: str):
    singles = [l for l in text.splitlines() if single in l]
    summaries = [int(m.group(1)) for m in map(_SUMMARY.search, text.splitlines()) if m]
    return singles, summaries


def _accounted(text: str, single: str) -> int:
    """Drops the log accounts for: one per single line, N per summary line."""
    singles, summaries = _drop_lines(text, single)
    return len(singles) + sum(summaries)


def _check_bounded(text: str, single: str, seconds: float):
    singles, summaries = _drop_lines(text, single)
    assert len(singles) <= 5, singles[:20]
    assert 1 <= len(summaries) <= seconds / INTERVAL + 2, summaries
    assert len(singles) + sum(summaries) == FLOOD, (len(singles), summaries)


def test_27_6_a_flood_of_bad_connections_is_logged_in_bounded_lines(tmp_path):
    extra = {"FLUIDCTL_DROP_LOG_INTERVAL": str(INTERVAL)}
    # a real pserver
    port, = local.free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    log = tmp_path / "serverlog.0"
    ps = local.start_pserver(0, [endpoint], trainers=1, token=TOKEN, log_path=str(log),
                             args=["--no-state"], extra_env=extra)
    # a real rendezvous store, logging as rank 0 does (its lines reach the workerlog)
    store_err = open(tmp_path / "store.err", "wb")
    store = subprocess.Popen([sys.executable, "-c", STORE_MAIN, TOKEN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=store_err,
                             env=dict(os.environ, **extra))
    store_err.close()
    try:
        store_port = int(store.stdout.readline())
        started = time.monotonic()
        _flood(port, FLOOD)
        _flood(store_port, FLOOD)
        # real clients are still served
        sock = wire.connect(endpoint, TOKEN, timeout=10, io_timeout=10)
        try:
            wire.send_frame(sock, {"op": "stats"})
            stats = wire.recv_frame(sock)[0]
        finally:
            sock.close()
        assert stats["op"] == "ok" and stats["dropped_connections"] == FLOOD
        client = StoreClient(f"127.0.0.1:{store_port}", TOKEN, timeout=10)
        try:
            client.set("k", b"v")
            assert client.get("k") == b"v"
        finally:
            client.close()
        # the last interval's summary is written by a timer
        store_log = tmp_path / "store.err"
        wait_for(lambda: _accounted(log.read_text(), "dropped connection from") >= FLOOD,
                 3 * INTERVAL + 5, "the pserver's summary line")
        wait_for(lambda: _accounted(store_log.read_text(), "store: dropping") >= FLOOD,
                 3 * INTERVAL + 5, "the store's summary line")
        seconds = time.monotonic() - started
        _check_bounded(log.read_text(), "dropped connection from", seconds)
        _check_bounded(store_log.read_text(), "store: dropping", seconds)
    finally:
        ps.kill()
        ps.wait()
        store.stdin.close()
        try:
            store.wait(10)
        except subprocess.TimeoutExpired:
            store.kill()
            store.wait()


# --- 27.15: fluidctl dump with a stopped rank returns the stacks that came --------------------

IDLE_RANK = r'''
import os, sys, time
from pathlib import Path
import fluidctl.runtime as rt
ctx = rt.init()
out = Path(sys.argv[1])
(out / f"pid.{ctx.rank}.tmp").write_text(str(os.getpid()))
os.replace(out / f"pid.{ctx.rank}.tmp", out / f"pid.{ctx.rank}")
def idle():
    while True:
        time.sleep(0.2)
idle()
'''


def test_27_15_dump_with_a_stopped_rank_returns_the_others_and_names_it(tmp_path):
    (tmp_path / "rank.py").write_text(IDLE_RANK)
    log = tmp_path / "log"
    env = dict(os.environ, FLUIDCTL_PYSPY="")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    job = subprocess.Popen([sys.executable, "-m", "fluidctl", "train", "--nproc", "3",
                            "--log-dir", str(log), str(tmp_path / "rank.py"), str(tmp_path)],
                           cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    pids = []
    try:
        wait_for(lambda: all((tmp_path / f"pid.{r}").exists() for r in range(3))
                 and (log / "job.json").exists(), 60, "three ranks up")
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(3)]
        os.kill(pids[1], signal.SIGSTOP)
        # a short --timeout: a stopped rank must not cost the others their stacks
        out = subprocess.run([sys.executable, "-m", "fluidctl", "dump", "--log-dir", str(log),
                              "--timeout", "4"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "ranks 0,2 are in idle at rank.py" in out.stdout, out.stdout
        assert f"rank 1: no stack (did not answer: pid {pids[1]} is stopped" in out.stdout
        assert job.poll() is None
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        local.stop([job])
