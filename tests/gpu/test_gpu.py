"""On a real GPU (see conftest.py): device selection per rank against nvidia-smi, every
collective and dtype with 1 and (2+ GPUs) 2 ranks, the handshake of the installed CuPy
(13 or 14), DistributedOptimizer and templates/train_nccl2.py learning on GPUs."""
import json
import os
import re
import subprocess
import sys

import pytest

import rankspawn

ROOT = rankspawn.ROOT


def fluidctl_train(tmp_path, *args, env=None, timeout=400):
    e = dict(os.environ, FLUIDCTL_TIMEOUT="120", **(env or {}))
    res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--tee", "all",
                          "--log-dir", str(tmp_path / "log"), *args], cwd=ROOT, env=e,
                         capture_output=True, text=True, timeout=timeout)
    return res


def rank_results(res):
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^\[trainer (\d+)\] RESULT (.*)$", line)
        if m:
            out[int(m.group(1))] = json.loads(m.group(2))
        elif line.startswith("RESULT "):
            out[0] = json.loads(line[7:])
    return [out[r] for r in sorted(out)]


def _pci(bus_id: str) -> str:
    """'00000000:17:00.0' (nvidia-smi) and '0000:17:00.0' (CUDA) name the same device."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):x}:{rest}"


def sizes(gpus):
    return [1] + ([2] if len(gpus) >= 2 else [])


@pytest.mark.parametrize("n", [1, 2])
def test_each_rank_runs_on_the_gpu_nvidia_smi_names(n, gpus, tmp_path):
    if n > len(gpus):
        pytest.skip(f"needs {n} GPUs, nvidia-smi lists {len(gpus)}")
    chosen = gpus[-n:]                             # the last ones: not simply 0..n-1
    ids = ",".join(g[0] for g in chosen) + ("," if n == 1 else "")
    res = fluidctl_train(tmp_path, "--gpus", ids, "tests/gpu_worker.py", "pci")
    assert res.returncode == 0, res.stdout + res.stderr
    got = rank_results(res)
    assert [_pci(r["pci_bus_id"]) for r in got] == [_pci(g[2]) for g in chosen]


@pytest.mark.parametrize("n", [1, 2])
def test_every_collective_and_dtype(n, gpus, tmp_path):
    if n > len(gpus):
        pytest.skip(f"needs {n} GPUs, nvidia-smi lists {len(gpus)}")
    res = fluidctl_train(tmp_path, "--gpus", str(n), "tests/gpu_worker.py", "ops")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [r["errors"] for r in rank_results(res)] == [[]] * n


@pytest.mark.parametrize("major", [13, 14])
def test_handshake_of_the_installed_cupy(major, gpus, tmp_path):
    installed = subprocess.run([sys.executable, "-c", "import cupy; print(cupy.__version__)"],
                               capture_output=True, text=True).stdout.strip()
    if int(installed.split(".")[0]) != major:
        pytest.skip(f"CuPy {installed} installed; pip install 'cupy-cuda12x=={major}.*' to "
                    f"run the CuPy {major} handshake")
    n = min(2, len(gpus))
    res = fluidctl_train(tmp_path, "--gpus", str(n), "tests/gpu_worker.py", "handshake")
    assert res.returncode == 0, res.stdout + res.stderr
    for r, out in enumerate(rank_results(res)):
        assert out["cupy"] == installed and out["nccl_rank"] == r and out["nccl_size"] == n


def test_distributed_optimizer_on_gpus(gpus, tmp_path):
    n = min(2, len(gpus))
    res = fluidctl_train(tmp_path, "--gpus", str(n), "tests/gpu_worker.py", "optimizer")
    assert res.returncode == 0, res.stdout + res.stderr
    outs = rank_results(res)
    assert all(o["types"] == ["cupy", "cupy"] for o in outs)
    assert all(o["w"] == outs[0]["w"] for o in outs)


def test_train_nccl2_learns_on_gpus(gpus, tmp_path):
    n = min(2, len(gpus))
    res = fluidctl_train(tmp_path, "--gpus", str(n), "templates/train_nccl2.py", "--epochs", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    seen = [(float(l), float(a)) for l, a in
            re.findall(r"epoch \d+: loss ([\d.]+) accuracy ([\d.]+)", res.stdout)]
    assert len(seen) == 3 and seen[-1][0] < seen[0][0] and seen[-1][1] > 0.7
    assert f"{n} trainer(s)" in res.stdout and "device gpu:0" in res.stdout


def test_a_pserver_trainer_on_a_gpu_that_is_not_there_gets_the_clear_error(gpus):
    """Real CuPy's own refusal of a device index past the last GPU, through the runtime's
    pserver-trainer path (no NCCL): one CollectiveError naming the rank and the GPU."""
    script = os.path.join(ROOT, "tests", "scripts", "init_or_error.py")
    missing = str(len(gpus))                       # CUDA numbers devices from 0
    env = dict(os.environ, PADDLE_TRAINING_ROLE="TRAINER", TRAINING_ROLE="TRAINER",
               PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:1", FLAGS_selected_gpus=missing,
               PADDLE_TRAINER_ID="0", PADDLE_TRAINERS_NUM="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)          # every GPU nvidia-smi lists is visible
    res = subprocess.run([sys.executable, script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"ERROR rank 0: cannot use GPU {missing} ("), \
        res.stdout + res.stderr


# --- queued work (issue 38): what tests/e2e/test_gpu_queue.py checks on the double ---------
def test_no_host_wait_per_allreduce(gpus, tmp_path):
    res = fluidctl_train(tmp_path, "--gpus", "1", "tests/gpu_worker.py", "host_waits")
    assert res.returncode == 0, res.stdout + res.stderr
    out = rank_results(res)[0]
    assert out["total"] == 0 and out["caller"] == 0 and out["ok"], out


def test_an_allreduce_captured_in_a_cuda_graph_is_replayed(gpus, tmp_path):
    """Stream capture: checked at capture time, no event queued for the watchdog (the query
    would be cudaErrorCapturedEvent), each launch of the graph reduces anew."""
    res = fluidctl_train(tmp_path, "--gpus", "1", "tests/gpu_worker.py", "graph_capture")
    assert res.returncode == 0, res.stdout + res.stderr
    assert rank_results(res)[0]["errors"] == []


def _two_ranks(gpus, tmp_path, *argv, env=None):
    if len(gpus) < 2:
        pytest.skip(f"needs 2 GPUs, nvidia-smi lists {len(gpus)}")
    return fluidctl_train(tmp_path, "--gpus", "2", "tests/gpu_worker.py", *argv,
                          env={"FLUIDCTL_TIMEOUT": "10", **(env or {})}, timeout=200)


def _first_results(res):
    firsts = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^\[trainer (\d+)\] RESULT (.*)$", line)
        if m and int(m.group(1)) not in firsts:
            firsts[int(m.group(1))] = json.loads(m.group(2))
    return [firsts[r] for r in sorted(firsts)]


def test_a_faulting_kernel_raises_on_every_ranks_next_call(gpus, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    from test_gpu_queue import sticky_errors_agree
    res = _two_ranks(gpus, tmp_path, "sticky")
    message = sticky_errors_agree(_first_results(res))
    assert "illegal" in message.lower(), message


def test_a_stalled_stream_is_reported_with_the_collectives_number(gpus, tmp_path):
    res = _two_ranks(gpus, tmp_path, "hang_in_flight")
    errors = {r["error"] for r in _first_results(res)}
    assert len(errors) == 1 and "collective #2) did not finish within 10s" in errors.pop()


def test_a_mismatch_after_the_hash_phase_is_named(gpus, tmp_path):
    res = _two_ranks(gpus, tmp_path, "mismatch", "hashed", "A", "B")
    errors = {r["error"] for r in _first_results(res)}
    assert len(errors) == 1
    assert "diverged at collective #10: allreduce: shape mismatch" in errors.pop()


def test_a_full_queue_waits_for_its_oldest_work(gpus, tmp_path):
    res = _two_ranks(gpus, tmp_path, "backpressure", env={"FLUIDCTL_GPU_INFLIGHT": "2"})
    assert res.returncode == 0, res.stdout + res.stderr
    out = rank_results(res)[0]
    assert max(out["inflight"]) <= 1 and out["after_sync"] == 0 and out["ok"], out
