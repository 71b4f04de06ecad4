"""The GPU path without a GPU: fluidctl's real NCCL code runs in real processes against the
strict CuPy/NCCL double in tests/cupy_double (whose NCCL really moves the ranks' bytes between
processes), for both CuPy API eras. Numbers in the comments are the issue's items."""
import json
import re
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import rankspawn
from fluidctl.runtime.collective import meta

DOUBLE = os.path.join(rankspawn.ROOT, "tests", "cupy_double")
NO_CUPY = os.path.join(rankspawn.ROOT, "tests", "no_cupy")


def gpu_ranks(n, tmp_path, argv, version="14.2.0", gpus=None, extra=None, per_rank=None,
              path=DOUBLE, timeout=90, until=None):
    envs = rankspawn.rank_envs(n, gpus=gpus or [str(i) for i in range(n)],
                               extra={"CUPY_DOUBLE_VERSION": version,
                                      "FLUIDCTL_TIMEOUT": "20", **(extra or {})})
    for r, env in enumerate(envs):
        env["PYTHONPATH"] = path + os.pathsep + env["PYTHONPATH"]
        env.update((per_rank or {}).get(r, {}))
    return rankspawn.Ranks(["tests/gpu_worker.py", *argv], envs, str(tmp_path)).wait(
        timeout, until=until)


def results(res):
    out = []
    for text in res.outputs:
        lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
        out.append(json.loads(lines[-1][7:]) if lines else None)
    return out


@pytest.mark.parametrize("version", ["14.2.0", "13.6.0"])
def test_gpu_ranks_select_their_device_and_build_one_communicator(version, tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"], version=version, gpus=["4", "7"])
    assert res.ok(), res
    for local_rank, r in enumerate(results(res)):
        assert r["device"] == f"gpu:{local_rank}" and r["current_device"] == local_rank
        assert r["xp"] == "cupy" and r["cupy"] == version
        assert (r["nccl_rank"], r["nccl_size"], r["nccl_device"]) == (local_rank, 2, local_rank)


# --- 7, 9, 6, 8, 14: every collective, every dtype, against numpy -----------------------------
@pytest.mark.parametrize("n,version", [(2, "14.2.0"), (3, "13.6.0")])
def test_every_collective_and_dtype_matches_numpy(n, version, tmp_path):
    res = gpu_ranks(n, tmp_path, ["ops"], version=version)
    assert res.ok(), res
    for r, out in enumerate(results(res)):
        assert out["errors"] == [], out
        assert out["device_id"] == r


def test_reduce_mean_divides_only_on_the_root(tmp_path):
    """9: NCCL's reduce leaves non-root buffers alone; the old code divided them anyway."""
    res = gpu_ranks(3, tmp_path, ["reduce_mean"])
    assert res.ok(), res
    from gpu_worker import inputs
    outs = results(res)
    want = sum(inputs(k, "float32") for k in range(3)) / 3
    np.testing.assert_allclose(outs[2]["x"], want, rtol=1e-6)
    for r in (0, 1):
        assert outs[r]["x"] == inputs(r, "float32").tolist()


def test_collectives_from_another_thread_and_inside_a_non_blocking_stream(tmp_path):
    """6, 8: CUDA's current device is per thread; NCCL must run on the rank's device with the
    caller's stream ordered before and after it (the double raises StreamRace when an event
    wait is missing either way: checked by deleting each from nccl.py)."""
    res = gpu_ranks(2, tmp_path, ["thread_stream"])
    assert res.ok(), res
    assert [r["errors"] for r in results(res)] == [[], []]


def test_collectives_on_two_streams_run_in_the_order_they_were_issued(tmp_path):
    """NCCL orders one communicator's collectives by issue, across streams: a later call on an
    idle stream does not overtake an earlier one on a busy stream (were it to, the ranks would
    wait on different collectives and hang)."""
    res = gpu_ranks(2, tmp_path, ["stream_order"], extra={"FLUIDCTL_TIMEOUT": "10"}, timeout=60)
    assert res.ok(), res
    assert [r["errors"] for r in results(res)] == [[], []]


def test_a_collective_captured_in_a_cuda_graph_is_checked_once_and_replayed(tmp_path):
    """38: under stream capture the checks happen at capture time and no completion event is
    queued for the watchdog (querying an event recorded in a capture is cudaErrorCapturedEvent);
    each launch of the graph reduces anew."""
    res = gpu_ranks(2, tmp_path, ["graph_capture"], extra={"FLUIDCTL_TIMEOUT": "10"},
                    timeout=60)
    assert res.ok(), res
    assert [r["errors"] for r in results(res)] == [[], []]


def test_no_host_wait_per_collective(tmp_path):
    """8, 38: a collective is queued on the caller's stream with one completion event that
    the watchdog polls: the host waits for nothing (the old code synced the caller's stream
    twice, then waited on its event once)."""
    res = gpu_ranks(2, tmp_path, ["host_waits"])
    assert res.ok(), res
    for out in results(res):
        assert out["caller"] == 0 and out["total"] == 0 and out["ok"], out


def test_arrays_on_another_device_fail_every_rank_alike(tmp_path):
    res = gpu_ranks(2, tmp_path, ["wrong_device"])
    assert res.ok(), res
    errors = {r["error"] for r in results(res)}
    assert len(errors) == 1
    assert "rank 1 passed a CuPy array on another GPU than its own" in errors.pop()


def test_dtypes_nccl_lacks_are_named_with_the_gpu_list(tmp_path):
    res = gpu_ranks(2, tmp_path, ["bad_dtype"])
    assert res.ok(), res
    errors = {r["error"] for r in results(res)}
    assert errors == {"rank 0 passed a CuPy int16 array, which NCCL collectives do not "
                      f"support (on GPUs use {meta.GPU_DTYPES})"}


# --- 1: DistributedOptimizer on CuPy parameters --------------------------------------------
@pytest.mark.parametrize("strategy", ["AllReduce", "Reduce"])
def test_distributed_optimizer_on_cupy_parameters_matches_cpu(strategy, tmp_path):
    gpu = gpu_ranks(2, tmp_path, ["optimizer", strategy])
    assert gpu.ok(), gpu
    (tmp_path / "cpu").mkdir()
    cpu = rankspawn.run(["tests/gpu_worker.py", "optimizer", strategy], 2, tmp_path / "cpu")
    assert cpu.ok(), cpu
    g, c = results(gpu), results(cpu)
    assert g[0]["types"] == ["cupy", "cupy"] and c[0]["types"] == ["numpy", "numpy"]
    # two buckets (float32, float64): one NCCL group per step, and for Reduce one more for
    # the owners' broadcast of the new values
    assert g[0]["events_per_step"] == [1 if strategy == "AllReduce" else 2] * 3
    for r in range(2):
        np.testing.assert_allclose(g[r]["w"], c[r]["w"], rtol=1e-6)
        np.testing.assert_allclose(g[r]["b"], c[r]["b"], rtol=1e-12)
    assert g[0]["w"] == g[1]["w"]


# --- 2, 4: every rank takes the same path, or fails at init() with one message ---------------
def test_a_rank_without_nccl_fails_every_rank_at_init(tmp_path):
    res = gpu_ranks(3, tmp_path, ["handshake"], per_rank={1: {"CUPY_DOUBLE_NCCL": "0"}},
                    timeout=60)
    assert res.returncodes == [3, 3, 3], res
    messages = {r["init_error"] for r in results(res)}
    assert len(messages) == 1
    message = messages.pop()
    assert "rank 1: CuPy 14.2.0 cannot load NCCL (pip install nvidia-nccl-cu12" in message
    assert "rank 0" not in message and "rank 2" not in message


def test_a_rank_that_cannot_use_its_device_fails_every_rank(tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"], per_rank={1: {"CUPY_DOUBLE_GPUS": "1"}})
    assert res.returncodes == [3, 3], res
    messages = {r["init_error"] for r in results(res)}
    assert len(messages) == 1
    assert "rank 1: cannot use GPU 1 (cudaErrorInvalidDevice" in messages.pop()


def test_no_rank_with_cupy_runs_everyone_on_cpu(tmp_path):
    res = gpu_ranks(2, tmp_path, ["where"], path=NO_CUPY)
    assert res.ok(), res
    assert results(res) == [{"device": "cpu", "xp": "numpy"}] * 2
    for out in res.outputs:
        assert "CuPy is not installed on any rank; running on CPU" in out


def test_one_rank_without_cupy_is_an_error_not_a_split(tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"],
                    per_rank={1: {"PYTHONPATH": NO_CUPY + os.pathsep + rankspawn.ROOT}})
    assert res.returncodes == [3, 3], res
    assert {r["init_error"] for r in results(res)} == {
        "GPU set-up failed, so no rank starts NCCL: rank 1: CuPy is not installed (every GPU "
        "rank needs CuPy with NCCL and a usable device: pip install 'fluidctl[gpu]')"}


# --- 5: failures end every rank with the same error, within the timeout ----------------------
def test_a_killed_rank_gives_collective_error_on_the_others(tmp_path):
    res = gpu_ranks(3, tmp_path, ["die"], timeout=60, until=[0, 2])
    assert res.returncodes[1] == -signal.SIGKILL, res
    outs = results(res)
    assert outs[0]["error"] == outs[2]["error"], res
    assert "rank 1 (pid" in outs[0]["error"] and "died" in outs[0]["error"]
    assert all(outs[r]["seconds"] < 20 for r in (0, 2))


def test_a_rank_that_never_calls_ends_the_others_at_the_timeout(tmp_path):
    res = gpu_ranks(2, tmp_path, ["stuck"], extra={"FLUIDCTL_TIMEOUT": "3"}, timeout=60,
                    until=[0])
    out = results(res)[0]
    assert "did not reach the collective within 3s" in out["error"] or \
        "did not finish within 3s" in out["error"], out
    assert out["seconds"] < 10


def test_an_nccl_error_on_one_rank_is_raised_on_every_rank(tmp_path):
    res = gpu_ranks(2, tmp_path, ["launch_error"], timeout=60)
    outs = results(res)
    assert outs[0]["error"] == outs[1]["error"], res
    # a handle that is no stream: CUDA's launch fails, NCCL says ncclUnhandledCudaError
    assert "NCCL allreduce failed on rank 1: NCCL_ERROR_UNHANDLED_CUDA_ERROR" in outs[0]["error"]


# --- the template under fluidctl train --gpus 2 (a fake nvidia-smi, the double) -------------
def test_train_nccl2_on_two_gpus_ends_with_the_cpu_runs_weights(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(
        f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}0000000-0000-0000-0000-000000000000)'\n"
        for i in range(2)))
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FLUIDCTL_TIMEOUT="60",
               PYTHONPATH=DOUBLE + os.pathsep + rankspawn.ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    common = ["templates/train_nccl2.py", "--epochs", "2", "--samples", "1024"]
    runs = {}
    for name, how in (("gpu", ["--gpus", "2"]), ("cpu", ["--nproc", "2"])):
        out = tmp_path / f"{name}.npz"
        res = subprocess.run([sys.executable, "-m", "fluidctl", "train", *how,
                              "--log-dir", str(tmp_path / f"log-{name}"), *common,
                              "--save-params", str(out)],
                             cwd=rankspawn.ROOT, env=env, capture_output=True, text=True,
                             timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[name] = (res.stdout, dict(np.load(out)))
    assert "device gpu:0" in runs["gpu"][0] and "device cpu" in runs["cpu"][0]
    assert "epoch 2: loss" in runs["gpu"][0]
    for key, value in runs["cpu"][1].items():
        np.testing.assert_allclose(runs["gpu"][1][key], value, rtol=1e-5, atol=1e-7)


def test_gpu_allreduce_bench_runs_its_fluidctl_half(tmp_path):
    """bench/gpu_allreduce.py end to end on the double (its torch half needs real GPUs)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: G (UUID: GPU-a)'\n"
                                       "echo 'GPU 1: G (UUID: GPU-b)'\n")
    (bindir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
               PYTHONPATH=DOUBLE + os.pathsep + rankspawn.ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run([sys.executable, "bench/gpu_allreduce.py", "--peer", "none",
                          "--sizes", "4KiB,64KiB", "--reps", "2"], cwd=rankspawn.ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "allreduce float32 sum, 2 GPU(s)" in res.stdout
    assert re.search(r"^\| 64 KiB \| [\d.]+ GB/s \(\d+ us\) \| - \| - \|$", res.stdout, re.M)


def test_a_pserver_trainer_that_cannot_use_its_gpu_gets_the_clear_error():
    """A parameter-server trainer takes its GPU without NCCL (runtime._use_device); a device
    CuPy refuses is the same one-line CollectiveError as in collective mode. It was a
    NameError: CollectiveError is loaded lazily and was never imported there."""
    script = os.path.join(rankspawn.ROOT, "tests", "scripts", "init_or_error.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env.update(PYTHONPATH=DOUBLE + os.pathsep + rankspawn.ROOT, CUPY_DOUBLE_VERSION="14.2.0",
               CUPY_DOUBLE_GPUS="1", PADDLE_TRAINING_ROLE="TRAINER", TRAINING_ROLE="TRAINER",
               PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:1", FLAGS_selected_gpus="1",
               PADDLE_TRAINER_ID="0", PADDLE_TRAINERS_NUM="1")
    res = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ERROR rank 0: cannot use GPU 1 (cudaErrorInvalidDevice"), \
        res.stdout + res.stderr
