"""Issue 26, "GPU path, second pass": one test (or a few) per defect, each failing on the code
before its fix. GPU parts run against the strict CuPy/NCCL double (tests/cupy_double)."""
import os
import subprocess
import sys
import textwrap

import pytest

import launchutil

ROOT = str(launchutil.ROOT)


# --- 1: torch and fluidctl's runtime in one script ------------------------------------------
TORCH_AND_FLUIDCTL = textwrap.dedent("""
    import os
    import fluidctl.runtime as rt
    ctx = rt.init()
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")              # env:// : MASTER_ADDR / MASTER_PORT
    t = torch.ones(4) * (ctx.rank + 1)
    dist.all_reduce(t)
    x = __import__("numpy").ones(4) * (ctx.rank + 1)
    ctx.allreduce(x)
    print("RESULT", ctx.rank, t.tolist(), x.tolist(), os.environ["MASTER_PORT"],
          os.environ["PADDLE_MASTER"], flush=True)
    dist.destroy_process_group()
    rt.finalize()
""")


def test_torch_process_group_beside_fluidctl_runtime_under_train(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "both.py"
    script.write_text(TORCH_AND_FLUIDCTL)
    res = launchutil.fluidctl("train", "--nproc", "2", "--tee", "all", "--log-dir",
                              tmp_path / "log", script, cwd=tmp_path,
                              env={"GLOO_SOCKET_IFNAME": "lo"}, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [l.split("RESULT", 1)[1].split() for l in res.stdout.splitlines() if "RESULT" in l]
    assert len(lines) == 2, res.stdout
    for words in lines:
        assert "[3.0," in "".join(words)
        torch_port, master = int(words[-2]), words[-1]
        assert torch_port != int(master.rsplit(":", 1)[1])   # torch got its own port
    assert lines[0][-2] == lines[1][-2]                       # the same one on every rank


# --- 2: several NCCL ranks on one physical GPU are refused at plan time ---------------------
from fluidctl import envs                                        # noqa: E402
from fluidctl.errors import UsageError                           # noqa: E402
from fluidctl.node import worker                                 # noqa: E402

MIG_SMI = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa0000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  0: (UUID: MIG-11110000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  1: (UUID: MIG-22220000-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb0000-0000-0000-0000-000000000000)
  MIG 7g.80gb     Device  0: (UUID: MIG-33330000-0000-0000-0000-000000000000)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc0000-0000-0000-0000-000000000000)
"""


def fake_smi(tmp_path, text):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "nvidia-smi").write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    (bindir / "nvidia-smi").chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def dry_run(tmp_path, *args, env=None):
    full = dict(os.environ, PATH=fake_smi(tmp_path, MIG_SMI), **(env or {}))
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.pop("NCCL_MULTI_RANK_GPU_ENABLE", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "fluidctl", "train", *args, "--dry-run",
                           "--json", "tests/scripts/behave.py"], cwd=ROOT, capture_output=True,
                          text=True, env=full, timeout=60)


def test_mig_siblings_of_one_gpu_are_refused_with_the_nccl_opt_in_named(tmp_path):
    res = dry_run(tmp_path, "--gpus", "2")
    assert res.returncode == 2, res.stdout + res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: node 127.0.0.1: local ranks 0 and 1 would share physical "
                           "GPU 0 (MIG-1111"), line
    assert "NCCL_MULTI_RANK_GPU_ENABLE=1" in line and "NCCL >= 2.30" in line
    ok = dry_run(tmp_path, "--gpus", "2", env={"NCCL_MULTI_RANK_GPU_ENABLE": "1"})
    assert ok.returncode == 0, ok.stderr
    # instances of different GPUs are fine
    assert dry_run(tmp_path, "--gpus", "2",
                   env={"CUDA_VISIBLE_DEVICES": "MIG-2222,MIG-3333"}).returncode == 0
    # pserver-mode trainers use no NCCL between them: siblings are fine there
    assert dry_run(tmp_path, "--mode", "pserver", "--gpus", "2").returncode == 0


def test_worker_under_mpirun_refuses_mig_siblings(tmp_path):
    environ = {"PATH": fake_smi(tmp_path, MIG_SMI), envs.GPUS: "all",
               envs.OMPI_LOCAL_SIZE: "2"}
    with pytest.raises(UsageError, match="share physical GPU 0"):
        worker.node_gpus(environ)
    assert len(worker.node_gpus(dict(environ, NCCL_MULTI_RANK_GPU_ENABLE="1"))) == 2


def slurm_env(procid, localid, ntasks_node, visible, **extra):
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
           "SLURM_LOCALID": str(localid), "SLURM_NODEID": "0",
           "SLURM_STEP_NUM_TASKS": str(ntasks_node), "SLURM_STEP_NODELIST": "n1",
           "SLURM_STEP_TASKS_PER_NODE": str(ntasks_node), "CUDA_VISIBLE_DEVICES": visible,
           "SLURM_CPUS_ON_NODE": "8"}
    env.update(extra)
    return env


def test_slurm_tasks_sharing_a_gpu_are_refused():
    # 2 tasks, one visible GPU each, and only one GPU in the step: both on GPU 0
    with pytest.raises(UsageError, match="2 tasks on this node with 1 GPU") as exc:
        envs.from_slurm(slurm_env(1, 1, 2, "0", SLURM_STEP_GPUS="0"))
    assert "with NCCL >= 2.30 set NCCL_MULTI_RANK_GPU_ENABLE=1)" in exc.value.one_line()
    with pytest.raises(UsageError, match="share a GPU"):
        envs.from_slurm(slurm_env(1, 1, 2, "0", SLURM_GPUS_ON_NODE="1"))
    # 8 tasks on 4 node-wide GPUs: task 5 would run on task 1's GPU
    with pytest.raises(UsageError, match="8 tasks on this node with 4 GPU"):
        envs.from_slurm(slurm_env(5, 5, 8, "0,1,2,3"))
    # the opt-in, and the bindings that are fine
    env = envs.from_slurm(slurm_env(5, 5, 8, "0,1,2,3", NCCL_MULTI_RANK_GPU_ENABLE="1"))
    assert env["FLAGS_selected_gpus"] == "1"
    assert envs.from_slurm(slurm_env(1, 1, 2, "1", SLURM_STEP_GPUS="0,1"))[
        "FLAGS_selected_gpus"] == "0"
    assert envs.from_slurm(slurm_env(3, 3, 4, "0,1,2,3"))["FLAGS_selected_gpus"] == "3"


# --- 11: MIG decided per entry, not from the list's first -----------------------------------
def test_a_list_mixing_whole_gpus_and_mig_instances_gives_each_rank_its_view():
    gpus = ["0", "MIG-a", "MIG-b"]
    seen = [envs.collective_env(rank=r, world_size=3, local_rank=r, local_size=3, nnodes=1,
                                endpoints=["h:1", "h:2", "h:3"], master="h:9",
                                gpus_on_node=gpus) for r in range(3)]
    assert [(e["CUDA_VISIBLE_DEVICES"], e["FLAGS_selected_gpus"]) for e in seen] == \
        [("0", "0"), ("MIG-a", "0"), ("MIG-b", "0")]
    env = envs.collective_env(rank=0, world_size=3, local_rank=0, local_size=3, nnodes=1,
                              endpoints=["h:1", "h:2", "h:3"], master="h:9",
                              gpus_on_node=["MIG-a", "2", "5"])
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-a" and env["PADDLE_WORLD_DEVICE_IDS"] == "0,0,1"
    env = envs.collective_env(rank=2, world_size=3, local_rank=2, local_size=3, nnodes=1,
                              endpoints=["h:1", "h:2", "h:3"], master="h:9",
                              gpus_on_node=["MIG-a", "2", "5"])
    assert (env["CUDA_VISIBLE_DEVICES"], env["FLAGS_selected_gpus"]) == ("2,5", "1")


# --- 3: a same-node peer killed inside a collective is seen within a second -----------------
import signal                                                    # noqa: E402

import rankspawn                                                 # noqa: E402
from test_runtime_gpu import DOUBLE, gpu_ranks, results          # noqa: E402


def test_a_same_node_rank_killed_inside_the_nccl_call_is_seen_within_a_second(tmp_path):
    res = gpu_ranks(3, tmp_path, ["die_in_kernel"], timeout=60, until=[0, 2])
    assert res.returncodes[1] == -signal.SIGKILL, res
    outs = results(res)
    assert outs[0]["error"] == outs[2]["error"], res
    assert "rank 1 (pid" in outs[0]["error"] and "same node) died" in outs[0]["error"]
    assert "NCCL allreduce (collective #2)" in outs[0]["error"]
    assert all(outs[r]["seconds"] < 2 for r in (0, 2)), outs


DOUBLE_PEER = textwrap.dedent("""
    import os, sys, time
    import cupy
    from cupy.cuda import nccl
    rank, path = int(sys.argv[1]), sys.argv[2]
    cupy.cuda.Device(rank).use()
    if rank == 0:
        open(path + ".tmp", "wb").write(nccl.get_unique_id()); os.rename(path + ".tmp", path)
    while not os.path.exists(path):
        time.sleep(0.01)
    comm = nccl.NcclCommunicator(2, open(path, "rb").read(), rank)
    x = cupy.ones(8, cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.get_current_stream().record())
    if rank == 1:
        os.kill(os.getpid(), 9)
    comm.allReduce(x.data.ptr, x.data.ptr, 8, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        try:
            comm.check_async_error()
        except nccl.NcclError as exc:
            print("ERROR", exc.status, flush=True); comm.abort(); sys.exit(0)
        time.sleep(0.01)
    print("NOTHING", s.done, flush=True)
    comm.abort()
""")


@pytest.mark.parametrize("hosts", [("a", "a"), ("a", "b")])
def test_the_double_reports_a_dead_peer_only_across_nodes_as_nccl_does(hosts, tmp_path):
    """NCCL's proxy notices a closed network connection (ncclRemoteError); peers on one node
    (P2P/SHM) post no proxy work, so their death is never reported: the call hangs."""
    script = tmp_path / "peer.py"
    script.write_text(DOUBLE_PEER)
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, PYTHONPATH=DOUBLE, CUPY_DOUBLE_HOST=hosts[rank])
        procs.append(subprocess.Popen([sys.executable, str(script), str(rank),
                                       str(tmp_path / "uid")], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out, err = procs[0].communicate(timeout=60)
    procs[1].wait(timeout=30)
    assert procs[1].returncode == -signal.SIGKILL
    assert out.split() == (["NOTHING", "False"] if hosts[0] == hosts[1] else ["ERROR", "6"]), \
        out + err


# --- 4: a sticky CUDA fault ends the collective at once, named -------------------------------
@pytest.mark.parametrize("case, words", [
    # 4: a sticky CUDA fault ends the collective at once, named
    ("cuda_fault", "NCCL allreduce (collective #2) on rank 1: CUDA fault on GPU 1: "
                   "cudaErrorIllegalAddress: an illegal memory access was encountered"),
    # 7: an NCCL status CuPy cannot name (its NcclError raises KeyError) is named
    ("nccl_status8", "NCCL allreduce (collective #2) failed on rank 1: NCCL returned status 8 "
                     "(ncclTimeout: NCCL's own timeout expired (NCCL >= 2.30))"),
])
def test_a_fault_inside_a_collective_is_named_alike_on_every_rank(tmp_path, case, words):
    res = gpu_ranks(2, tmp_path, [case], timeout=60)
    outs = results(res)
    assert outs[0]["error"] == outs[1]["error"], res
    assert words in outs[0]["error"], outs
    assert all(o["seconds"] < 5 for o in outs), outs


@pytest.fixture
def double(monkeypatch):
    """The double imported in this process (fresh, with this test's environment)."""
    import importlib
    sys.path.insert(0, DOUBLE)
    for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        yield importlib.import_module("cupy")
    finally:
        sys.path.remove(DOUBLE)
        for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
            del sys.modules[name]


def test_the_double_keeps_a_sticky_fault_as_cuda_does(double):
    cupy = double
    runtime = cupy.cuda.runtime
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record()
    assert runtime.eventQuery(ev.ptr) == 0 and ev.done
    cupy._double.fault(719)
    assert runtime.eventQuery(ev.ptr) == 719 and not ev.done
    with pytest.raises(runtime.CUDARuntimeError, match="^cudaErrorLaunchFailure: "
                       "unspecified launch failure$") as exc:
        ev.synchronize()
    assert exc.value.status == 719
    with pytest.raises(runtime.CUDARuntimeError):
        cupy.cuda.get_current_stream().synchronize()


# --- 5: bfloat16 end to end on every transport -----------------------------------------------
@pytest.mark.parametrize("transport", ["shm", "ring"])
def test_bfloat16_on_the_cpu_transports_rounds_once(transport, tmp_path):
    pytest.importorskip("ml_dtypes")
    res = rankspawn.run(["tests/scripts/bf16_worker.py", transport], 3, tmp_path)
    assert res.ok(), res
    for out in rankspawn.results(res):
        assert out["transport"] == transport
        assert out["sum"] == [258.0, 4.5, -9.0]
        assert out["mean"] == [2.0, 2.0] and out["max"] == 2.0
        assert out["gather"] == [0.5, 1.5, 2.5] and out["bcast"] == 7.0
        assert out["w"] == [0.0] * 4 and out["w_dtype"] == "bfloat16"    # 1 - 0.5 * mean(1,2,3)
        assert out["float8"] == ("rank 0 passed float8_e4m3fn, which collectives do not support "
                                 "(use float16/32/64, bfloat16, int8-64, uint8-64 or bool)")


@pytest.mark.parametrize("strategy", ["AllReduce", "Reduce"])
def test_distributed_optimizer_takes_bfloat16_cupy_parameters(strategy, tmp_path):
    pytest.importorskip("ml_dtypes")
    res = gpu_ranks(2, tmp_path, ["bf16_optimizer", strategy])
    assert res.ok(), res
    for out in results(res):
        assert out["dtype"] == "bfloat16" and out["type"] == "cupy"
        assert out["w"] == [0.25] * 4                  # 1 - 0.5 * mean(1, 2)


# --- 6: an id list in FLUIDCTL_GPUS under torchrun / a bare mpirun ---------------------------
def test_fluidctl_gpus_id_list_picks_the_local_ranks_id():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", envs.GPUS: "1,3"}
    assert envs.read(torchrun).selected_gpu == 1
    assert envs.read(dict(torchrun, LOCAL_RANK="1")).selected_gpu == 3
    # under CUDA_VISIBLE_DEVICES the id becomes its index there
    assert envs.read(dict(torchrun, LOCAL_RANK="1",
                          CUDA_VISIBLE_DEVICES="0,1,2,3")).selected_gpu == 3
    assert envs.read(dict(torchrun, CUDA_VISIBLE_DEVICES="3,1")).selected_gpu == 1
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
              "OMPI_COMM_WORLD_LOCAL_RANK": "1", envs.GPUS: "2,5"}
    assert envs.read(mpirun).selected_gpu == 5
    assert envs.read(dict(torchrun, **{envs.GPUS: "all"}, LOCAL_RANK="1")).selected_gpu == 1
    with pytest.raises(UsageError, match="names 2 GPU\\(s\\) but this is local rank 2"):
        envs.read(dict(torchrun, LOCAL_RANK="2"))
    with pytest.raises(UsageError, match="GPU 3 is not in CUDA_VISIBLE_DEVICES=0,1"):
        envs.read(dict(torchrun, LOCAL_RANK="1", CUDA_VISIBLE_DEVICES="0,1"))


# --- 7: NCCL statuses CuPy cannot name; NCCL_COMM_BLOCKING=0 -------------------------------
def test_nccl_comm_blocking_0_is_refused_on_every_rank_at_init(tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"], extra={"NCCL_COMM_BLOCKING": "0"})
    assert res.returncodes == [3, 3], res
    messages = {r["init_error"] for r in results(res)}
    assert len(messages) == 1
    assert "rank 0: NCCL_COMM_BLOCKING=0 asks for non-blocking NCCL communicators, which CuPy " \
        "cannot drive" in messages.pop()


def test_the_double_raises_keyerror_for_statuses_cupy_cannot_name(double, monkeypatch):
    nccl = double.cuda.nccl
    for status in (7, 8):
        with pytest.raises(KeyError, match=str(status)):
            nccl.check_status(status)
    monkeypatch.setenv("NCCL_COMM_BLOCKING", "0")
    with pytest.raises(KeyError):
        nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


# --- 8: CuPy 14.0.0a1 still takes the id as a tuple ------------------------------------------
@pytest.mark.parametrize("version", ["14.0.0a1", "14.2.0", "13.6.0"])
def test_the_unique_id_form_follows_the_constructor_not_the_major(version, tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"], version=version)
    assert res.ok(), res
    assert [r["nccl_rank"] for r in results(res)] == [0, 1]


# --- 9: communicator creation: O(n) store requests, one message on every rank ---------------
def test_creating_the_communicator_costs_two_store_requests_per_rank_and_poll(tmp_path):
    """While rank 1's ncclCommInitRank takes 1 s the others poll every 50 ms: the old loop
    read every rank's key twice per poll (2n requests per rank: 4 ranks ~640 in 1 s)."""
    res = gpu_ranks(4, tmp_path, ["slow_init"])
    assert res.ok(), res
    requests = results(res)[0]["requests"]
    assert requests < 260, requests          # 4 ranks x 20 polls x 2, plus set-up
    # the server answers the wait: one parked request per rank per half second, plus set-up
    assert requests < 100, requests


def test_a_rank_stuck_creating_its_communicator_gives_every_rank_the_same_message(tmp_path):
    """The old message began with each rank's own number ("rank 0: creating ... did not
    finish"); now the first rank at the deadline posts one for all (ncclCommInitRank waits
    for every rank, so all are still inside)."""
    res = gpu_ranks(3, tmp_path, ["init_stuck"], extra={"FLUIDCTL_TIMEOUT": "3"}, timeout=60)
    assert res.returncodes == [3, 3, 3], res
    messages = {r["init_error"] for r in results(res)}
    assert messages == {"creating the NCCL communicator did not finish within 3s: rank(s) "
                        "0, 1, 2 still in ncclCommInitRank (a rank did not start, or NCCL "
                        "cannot connect the nodes: set NCCL_DEBUG=INFO and NCCL_SOCKET_IFNAME)"}


# --- 10: install hints follow the installed CuPy's CUDA major --------------------------------
def test_the_nccl_hint_follows_cupys_cuda_major(tmp_path):
    res = gpu_ranks(2, tmp_path, ["handshake"], extra={"CUPY_DOUBLE_NCCL": "0",
                                                      "CUPY_DOUBLE_CUDA_VERSION": "13000"})
    assert res.returncodes == [3, 3], res
    message = results(res)[0]["init_error"]
    assert "rank 0: CuPy 14.2.0 cannot load NCCL (pip install nvidia-nccl-cu13, or pip " \
        "install 'fluidctl[gpu-cuda13]')" in message, message


def test_cluster_checks_line_names_the_nccl_wheel_of_the_cupy_installed(monkeypatch):
    from fluidctl.node import gpustack
    from fluidctl.runtime import gpuinstall
    found = {"cupy-cuda13x": "14.2.0"}

    def fake_installed(names):
        for n in names:
            if n in found:
                return n, found[n]
        return "", ""
    monkeypatch.setattr(gpustack, "installed", fake_installed)
    assert gpustack.describe(0) == ("CuPy 14.2.0, no NCCL (pip install nvidia-nccl-cu13, or "
                                    "pip install 'fluidctl[gpu-cuda13]'), no usable GPU")
    assert gpuinstall.cuda_major_of_dist("cupy-cuda12x") == 12
    assert gpuinstall.cuda_major_of_dist("cupy") is None


def test_setup_cfg_pairs_cupy_and_nccl_per_cuda_major():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    extras = {k: v.split() for k, v in cfg["options.extras_require"].items()}
    assert extras["gpu"] == extras["gpu-cuda12"] == ["cupy-cuda12x>=13", "nvidia-nccl-cu12"]
    assert extras["gpu-cuda13"] == ["cupy-cuda13x>=14", "nvidia-nccl-cu13"]


# --- 12: each node gets its own interface ---------------------------------------------------
def test_each_node_gets_its_own_socket_interface():
    from types import SimpleNamespace as NS
    from fluidctl.backends.ssh.launcher import SSHLauncher
    a = {"lo": [["127.0.0.1", "255.0.0.0"]], "eth0": [["10.0.0.5", "255.255.255.0"]]}
    b = {"lo": [["127.0.0.1", "255.0.0.0"]], "ens5": [["10.0.0.6", "255.255.255.0"]]}
    procs = [NS(node=i, env={}) for i in (0, 0, 1, 1, 2)]
    nodes = [NS(address="10.0.0.5", label="a"), NS(address="10.0.0.6", label="b"),
             NS(address="10.9.9.9", label="c")]
    plan = NS(job=NS(nodes=nodes), on_node=lambda i: [p for p in procs if p.node == i])
    logged = []
    me = NS(agents=[NS(probe=NS(ifaces=a)), NS(probe=NS(ifaces=b)), NS(probe=NS(ifaces=b))],
            log=logged.append)
    SSHLauncher._socket_ifnames(me, NS(user_env={}), plan, me.agents)
    assert [p.env for p in procs[:4]] == \
        [{"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0"}] * 2 + \
        [{"NCCL_SOCKET_IFNAME": "=ens5", "GLOO_SOCKET_IFNAME": "ens5"}] * 2
    assert procs[4].env == {}                          # node c: its interface is unknown
    procs = [NS(node=0, env={})]
    SSHLauncher._socket_ifnames(me, NS(user_env={"GLOO_SOCKET_IFNAME": "x"}), plan, me.agents)
    assert procs[0].env == {}


# --- 13: events without timing; the bench's figure for one GPU -------------------------------
def test_collectives_create_no_timing_events(tmp_path):
    res = gpu_ranks(2, tmp_path, ["events"])
    assert res.ok(), res
    for out in results(res):
        assert out == {"timing": 0, "plain": 0}, out     # untimed events from a pool


def test_gpu_bench_on_one_gpu_reports_algbw_not_busbw(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: G (UUID: GPU-a)'\n")
    (bindir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
               PYTHONPATH=DOUBLE + os.pathsep + ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run([sys.executable, "bench/gpu_allreduce.py", "--gpus", "1", "--peer",
                          "none", "--sizes", "4KiB", "--reps", "2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(algbw = S/t: one GPU moves nothing between GPUs, busbw would be 0)" in res.stdout


# --- the double, corrected from the real sources ---------------------------------------------
def test_double_current_stream_is_per_thread_and_device_and_checks_the_device(double):
    cuda = double.cuda
    with cuda.Device(1):
        s1 = cuda.Stream(non_blocking=True)
        s1.use()
        assert cuda.get_current_stream() is s1 and s1.is_non_blocking
    assert cuda.get_current_stream() is cuda.Stream.null       # device 0: its own
    assert cuda.get_current_stream(1) is s1
    with pytest.raises(RuntimeError, match=r"The device that the stream is created on \(1\) "
                       r"does not match with the current device \(0\)"):
        s1.use()
    with pytest.raises(RuntimeError, match="does not match"):
        with s1:
            pass
    seen = {}
    t = __import__("threading").Thread(
        target=lambda: seen.update(s=cuda.get_current_stream(1)))
    t.start()
    t.join()
    assert seen["s"] is cuda.Stream.null                        # another thread: its own
    assert not hasattr(s1, "non_blocking")


def test_double_events_belong_to_a_device(double):
    cuda = double.cuda
    ev = cuda.Event(disable_timing=True)
    with cuda.Device(1):
        s1 = cuda.Stream()
    with pytest.raises(cuda.runtime.CUDARuntimeError, match="cudaErrorInvalidResourceHandle"):
        ev.record(s1)
    with pytest.raises(ValueError, match="Timing must be disabled for interprocess events"):
        cuda.Event(interprocess=True)


@pytest.mark.parametrize("visible,count", [
    ("GPU-aaaa,GPU-bbbb", 2), ("MIG-aaaa,MIG-bbbb", 1), ("0,GPU-bbbb,9", 2), ("1,1,2", 1),
    ("0,x,1", 1), ("", 0)])
def test_double_device_count_follows_cudas_enumeration(visible, count, monkeypatch, double):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("CUPY_DOUBLE_GPUS", "4")
    assert double.cuda.runtime.getDeviceCount() == count


def test_double_checks_pointers_only_with_nccl_check_pointers(double, monkeypatch):
    from cupy.cuda import nccl
    cuda = double.cuda
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    s = cuda.Stream(non_blocking=True)
    host = __import__("numpy").ones(4, "float32")          # not device memory
    ptr = host.__array_interface__["data"][0]
    monkeypatch.setenv("NCCL_CHECK_POINTERS", "1")
    with pytest.raises(nccl.NcclError, match="NCCL_ERROR_INVALID_ARGUMENT"):
        comm.allReduce(ptr, ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
    monkeypatch.delenv("NCCL_CHECK_POINTERS")
    with pytest.raises(nccl.NcclError, match="NCCL_ERROR_UNHANDLED_CUDA_ERROR"):
        comm.allReduce(ptr, ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 12345)   # no stream
    comm.allReduce(ptr, ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)  # the kernel faults
    import time
    deadline = time.monotonic() + 5
    while cuda.runtime.streamQuery(s.ptr) not in (700,) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cuda.runtime.streamQuery(s.ptr) == 700                 # sticky illegal address
    comm.abort()
    with pytest.raises(nccl.NcclError, match="NCCL_ERROR_INVALID_ARGUMENT"):
        comm.check_async_error()                                   # after abort(): _comm = 0


DOUBLE_SAME_GPU = textwrap.dedent("""
    import os, sys, time
    import cupy
    from cupy.cuda import nccl
    rank, path = int(sys.argv[1]), sys.argv[2]
    cupy.cuda.Device(0).use()
    if rank == 0:
        open(path + ".tmp", "wb").write(nccl.get_unique_id()); os.rename(path + ".tmp", path)
    while not os.path.exists(path):
        time.sleep(0.01)
    try:
        comm = nccl.NcclCommunicator(2, open(path, "rb").read(), rank)
        print("OK", flush=True)
        comm.destroy()
    except nccl.NcclError as exc:
        print("ERROR", exc.status, flush=True)
    open(f"{path}.{rank}", "w").close()          # rank 0's process holds the hub: it stays
    end = time.monotonic() + 20                   # until rank 1 has its answer
    while rank == 0 and not os.path.exists(f"{path}.1") and time.monotonic() < end:
        time.sleep(0.01)
""")


@pytest.mark.parametrize("version,enable,want", [
    ("23203", "0", "ERROR 5"), ("23203", "1", "OK"), ("22903", "1", "ERROR 5")])
def test_double_refuses_two_ranks_on_one_gpu_as_nccl_does(version, enable, want, tmp_path):
    script = tmp_path / "same.py"
    script.write_text(DOUBLE_SAME_GPU)
    procs = [subprocess.Popen(
        [sys.executable, str(script), str(rank), str(tmp_path / "uid")], text=True,
        env=dict(os.environ, PYTHONPATH=DOUBLE, CUDA_VISIBLE_DEVICES="3",
                 CUPY_DOUBLE_NCCL_VERSION=version, NCCL_MULTI_RANK_GPU_ENABLE=enable),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [o[0].strip() for o in outs] == [want, want], outs


# --- 2 (at run time): ranks started by hand, torchrun or mpirun on one GPU ------------------
@pytest.mark.parametrize("version,enable,outcome", [
    ("23203", "0", "set NCCL_MULTI_RANK_GPU_ENABLE=1"),
    ("22903", "1", "NCCL 2.29.3 here allows it only from 2.30"), ("23203", "1", None)])
def test_ranks_sharing_one_gpu_fail_at_init_naming_the_opt_in(version, enable, outcome,
                                                               tmp_path):
    per = {r: {"CUDA_VISIBLE_DEVICES": "5", "FLAGS_selected_gpus": "0"} for r in (0, 1)}
    res = gpu_ranks(2, tmp_path, ["handshake"], per_rank=per,
                    extra={"CUPY_DOUBLE_NCCL_VERSION": version,
                           "NCCL_MULTI_RANK_GPU_ENABLE": enable})
    if outcome is None:
        assert res.ok(), res
        return
    assert res.returncodes == [3, 3], res
    messages = {r["init_error"] for r in results(res)}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith("ranks 0 and 1 are on one GPU (PCI 0000:15:00.0 of "), message
    assert "which NCCL refuses (\"Duplicate GPU detected\")" in message and outcome in message


# --- the one-GPU check dry-runs here, on the double --------------------------------------------
def test_one_gpu_check_dry_runs_on_the_double(tmp_path):
    report = tmp_path / "gpu-check.txt"
    env = dict(os.environ, PYTHON=sys.executable, FLUIDCTL_GPU_CHECK_TIMEOUT="4")
    res = subprocess.run(["tests/gpu/one_gpu_check.sh", "--double", str(report)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=400)
    text = report.read_text()
    assert res.returncode == 0, text + res.stderr
    lines = text.splitlines()
    assert "DRY RUN against tests/cupy_double" in lines[0]
    assert lines[2].startswith("versions: {") and '"cupy": "14.2.0"' in lines[2]
    steps = [l for l in lines if l[:4] in ("PASS", "FAIL", "SKIP")]
    assert len(steps) == 17 and not [l for l in steps if l.startswith("FAIL")], text
    assert "Duplicate GPU detected" in text and "NCCL_MULTI_RANK_GPU_ENABLE=1" in text
    assert steps[-1].startswith("SKIP  pytest -m gpu")          # no real GPU here
    assert lines[-1].startswith("summary: 16 passed, 0 failed, 1 skipped")
