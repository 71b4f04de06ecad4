"""Device planning in-process: PADDLE_WORLD_DEVICE_IDS, PCI bus order, torchrun's LOCAL_RANK,
pserver trainers' device names."""
from fluidctl import envs
from fluidctl.planning import plan as planner


def env_of(**kw):
    base = dict(rank=0, world_size=4, local_rank=1, local_size=2, nnodes=2,
                endpoints=["a:1", "a:2", "b:1", "b:2"], master="a:9")
    base.update(kw)
    return envs.collective_env(**base)


# --- 10: PADDLE_WORLD_DEVICE_IDS as Paddle writes it --------------------------------------------
def test_world_device_ids_one_entry_per_trainer_relative_to_its_visible_devices():
    """Paddle's fleet/launch_utils.py: ",".join(":".join(trainer's accelerators)), the
    accelerators being indices into CUDA_VISIBLE_DEVICES. The old value was per node,
    physical ids, ':'-separated ("2,3:0,1")."""
    env = env_of(gpus_on_node=["2", "3"], world_device_ids=[["2", "3"], ["0", "1"]])
    assert env["PADDLE_WORLD_DEVICE_IDS"] == "0,1,0,1"
    assert env["PADDLE_LOCAL_DEVICE_IDS"] == env["FLAGS_selected_gpus"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"


# --- 13: nvidia-smi's order, UUIDs, MIG --------------------------------------------------------
def test_gpu_ranks_get_pci_bus_order_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert env_of(gpus_on_node=["0", "1"])["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" not in env_of()                       # CPU ranks
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert "CUDA_DEVICE_ORDER" not in env_of(gpus_on_node=["0", "1"])  # theirs passes through


def test_torchrun_local_rank_picks_the_device_with_fluidctl_gpus():
    env = envs.read({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2", envs.GPUS: "all"})
    assert env.selected_gpu == 1 and env.backend == "nccl"
    assert envs.read({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}).selected_gpu is None


def test_pserver_mode_trainers_get_the_device_names_too(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    env = planner._local_names(1, 2, 0, 1, "127.0.0.1:9", ("0", "1"), [["0", "1"]])
    assert env["FLAGS_selected_gpus"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PADDLE_WORLD_DEVICE_IDS"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
