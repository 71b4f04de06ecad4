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
