"""Pservers and trainers as real processes with the launcher's environment contract
(fluidctl.envs.pserver_env): sync SGD equals single-process full-batch SGD; a pserver killed
with -9 and restarted from its checkpoint lets training finish with the uninterrupted loss;
async mode applies every push."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fluidctl import envs
from fluidctl.runtime import wire
import pserverutil as local
from launchutil import TEMPLATES

TOKEN = "e2e-token"

MODEL = r'''
import numpy as np

def make_data(n=256, d=20, k=1000, noise=0.5):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    Y = X @ rng.standard_normal((d, k)) + noise * rng.standard_normal((n, k))
    return X, Y

def init_params(d=20, k=1000):
    return {"W": np.random.default_rng(1).standard_normal((d, k)) * 0.01, "b": np.zeros(k)}

def grads(p, X, Y):
    r = X @ p["W"] + p["b"] - Y
    return {"W": X.T @ r / len(X), "b": r.mean(0)}

def loss(p, X, Y):
    r = X @ p["W"] + p["b"] - Y
    return float(0.5 * (r * r).sum(1).mean())
'''

TRAINER = MODEL + r'''
import json, os, sys, time
from pathlib import Path
from fluidctl import envs
from fluidctl.runtime import wire
from fluidctl.runtime import optim
from fluidctl.runtime.pserver.client import PServerOptimizer

out, steps, lr, gate = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
env = envs.read()
X, Y = make_data()
part = len(X) // env.world_size
xs, ys = X[env.rank * part:(env.rank + 1) * part], Y[env.rank * part:(env.rank + 1) * part]
params = init_params()
opt = PServerOptimizer(params, optimizer=optim.SGD(lr))
for step in range(steps):
    if step == gate:
        (out / f"paused.{env.rank}").touch()
        while not (out / "go").exists():
            time.sleep(0.01)
    opt.step(grads(params, xs, ys))
stats = opt.stats()
np.save(out / f"W.{env.rank}.npy", params["W"])
np.save(out / f"b.{env.rank}.npy", params["b"])
(out / f"result.{env.rank}.json").write_text(json.dumps(
    {"loss": loss(params, X, Y), "reconnects": opt.reconnects, "stats": stats}))
opt.close()
'''


def model():
    ns = {}
    exec(MODEL, ns)
    return ns


def reference(steps, lr):
    """Single-process full-batch SGD: what sync pserver training must reproduce."""
    m = model()
    X, Y = m["make_data"]()
    p = m["init_params"]()
    for _ in range(steps):
        g = m["grads"](p, X, Y)
        for k in p:
            p[k] -= lr * g[k]
    return p, m["loss"](p, X, Y)


class Job:
    def __init__(self, tmp: Path, pservers: int, trainers: int, sync: bool = True):
        self.tmp, self.trainers, self.sync = tmp, trainers, sync
        self.endpoints = [f"127.0.0.1:{p}" for p in local.free_ports(pservers)]
        self.servers, self.workers = [], []
        (tmp / "trainer.py").write_text(TRAINER)

    def start_pserver(self, i, *args):
        proc = local.start_pserver(i, self.endpoints, self.trainers, sync=self.sync, token=TOKEN,
                                   log_path=str(self.tmp / f"serverlog.{i}"),
                                   args=["--no-state", *args])
        if i < len(self.servers):
            self.servers[i] = proc
        else:
            self.servers.append(proc)
        return proc

    def start_trainers(self, steps, lr, gate=-1):
        for t in range(self.trainers):
            env = local.role_env(envs.ROLE_TRAINER, t, self.endpoints, self.trainers, self.sync,
                                 TOKEN, {envs.TIMEOUT: "60"})
            with open(self.tmp / f"workerlog.{t}", "wb") as log:
                self.workers.append(subprocess.Popen(
                    [sys.executable, str(self.tmp / "trainer.py"), str(self.tmp), str(steps),
                     str(lr), str(gate)], env=env, stdout=log, stderr=subprocess.STDOUT))

    def wait_trainers(self, timeout=60):
        deadline = time.monotonic() + timeout
        for t, p in enumerate(self.workers):
            try:
                code = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                code = "timeout"
            assert code == 0, f"trainer {t}: {code}\n" + (
                self.tmp / f"workerlog.{t}").read_text()[-3000:]
        return [json.loads((self.tmp / f"result.{t}.json").read_text())
                for t in range(self.trainers)]

    def close(self):
        for p in self.workers:
            if p.poll() is None:
                p.kill()
        return local.stop([s for s in self.servers if s.poll() is None])


def server_stats(endpoint):
    sock = wire.connect(endpoint, TOKEN)
    try:
        wire.send_frame(sock, {"op": "stats"})
        return wire.recv_frame(sock)[0]
    finally:
        sock.close()


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def job_factory(tmp_path):
    jobs = []

    def make(*args, **kw):
        jobs.append(Job(tmp_path, *args, **kw))
        return jobs[-1]
    yield make
    for j in jobs:
        j.close()


def test_sync_2x2_equals_single_process_full_batch_sgd(job_factory):
    steps, lr = 12, 0.05
    job = job_factory(pservers=2, trainers=2)
    job.start_pserver(0)
    job.start_pserver(1)
    job.start_trainers(steps, lr)
    results = job.wait_trainers()
    ref, _ = reference(steps, lr)
    for t in range(2):
        for name in ("W", "b"):
            got = np.load(job.tmp / f"{name}.{t}.npy")
            rel = np.abs(got - ref[name]).max() / np.abs(ref[name]).max()
            assert rel < 1e-6, (t, name, rel)
    # W (20x1000) was sliced into two blocks, one per pserver; b went whole to one of them
    stats = results[0]["stats"]
    assert sorted(s["params"] for s in stats) == [1, 2]
    assert [s["step"] for s in stats] == [steps, steps]
    assert all(s["applied"] == s["pushed"] == 2 * steps for s in stats)
    assert job.close() == [0, 0]


def test_kill_9_a_pserver_restart_from_checkpoint_and_finish(job_factory):
    steps, lr, gate = 60, 0.05, 22
    job = job_factory(pservers=2, trainers=2)
    ckpt = job.tmp / "ckpt"
    args = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"]
    job.start_pserver(0, *args)
    victim = job.start_pserver(1, *args)
    job.start_trainers(steps, lr, gate)
    wait_until(lambda: all((job.tmp / f"paused.{t}").exists() for t in range(2)),
               what="trainers to reach step 22")
    victim.kill()                                            # SIGKILL: no goodbye, no save
    victim.wait()
    (job.tmp / "go").touch()
    wait_until(lambda: all("unreachable" in (job.tmp / f"workerlog.{t}").read_text()
                           for t in range(2)), what="trainers to notice the dead pserver")
    job.start_pserver(1, *args)                              # same port, same checkpoint dir
    results = job.wait_trainers()
    log = (job.tmp / "serverlog.1").read_text()
    assert "loaded checkpoint" in log and "step 20," in log  # last multiple of 5 before 22
    assert all(r["reconnects"] >= 1 for r in results)
    _, uninterrupted = reference(steps, lr)
    for r in results:
        assert abs(r["loss"] - uninterrupted) <= 0.05 * uninterrupted, (r["loss"], uninterrupted)
    manifest = json.loads((ckpt / "pserver.1" / "manifest.json").read_text())
    assert manifest["step"] % 5 == 0 and manifest["step"] >= 55
    assert job.close() == [0, 0]
    # SIGTERM wrote a final checkpoint at the last step
    assert json.loads((ckpt / "pserver.1" / "manifest.json").read_text())["step"] == steps


def test_async_applies_every_push(job_factory):
    steps, lr = 15, 0.02
    job = job_factory(pservers=2, trainers=2, sync=False)
    job.start_pserver(0)
    job.start_pserver(1)
    job.start_trainers(steps, lr)
    results = job.wait_trainers()
    m = model()
    X, Y = m["make_data"]()
    assert all(r["loss"] < m["loss"](m["init_params"](), X, Y) for r in results)
    for endpoint in job.endpoints:                          # both trainers are done now
        stats = server_stats(endpoint)
        assert stats["applied"] == stats["pushed"] == 2 * steps == stats["step"]
    assert job.close() == [0, 0]


TEMPLATE = TEMPLATES / "train_pserver.py"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_ctr_template_learns_in_both_modes(job_factory, sync):
    job = job_factory(pservers=2, trainers=2, sync=sync)
    job.start_pserver(0)
    job.start_pserver(1)
    procs = [subprocess.Popen(
        [sys.executable, str(TEMPLATE), "--steps", "120"],
        env=local.role_env(envs.ROLE_TRAINER, t, job.endpoints, 2, sync, TOKEN),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for t in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        first, last = re.search(r"done: loss ([0-9.]+) -> ([0-9.]+)", out).groups()
        # an untrained model scores about 0.69; in async mode a trainer that starts late
        # already begins from a trained model, so compare with that, not with its first loss
        assert float(last) < 0.55, (first, out)
    rows = [server_stats(ep)["sparse_rows"] for ep in job.endpoints]
    assert all(r > 0 for r in rows)                  # embedding rows spread over both pservers
