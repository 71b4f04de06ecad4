"""GPU ranks without a GPU: a fake CuPy (tests/fake_cupy) lets device selection and the NCCL
unique-id exchange through the store run in real processes, for both CuPy API eras."""
import os

import pytest

import rankspawn
from fluidctl.runtime.collective.nccl import decode_unique_id, encode_unique_id

FAKE = os.path.join(rankspawn.ROOT, "tests", "fake_cupy")
NO_CUPY = os.path.join(rankspawn.ROOT, "tests", "no_cupy")


def test_unique_id_round_trips_in_both_forms():
    signed = tuple(range(-128, 0)) + tuple(range(0, 128))
    data = encode_unique_id(signed)
    assert isinstance(data, bytes) and len(data) == 256
    assert decode_unique_id(data, as_bytes=False) == signed
    assert decode_unique_id(encode_unique_id(b"\x00\xff"), as_bytes=True) == b"\x00\xff"


@pytest.mark.parametrize("version,uid_type", [("14.0.0", "bytes"), ("13.6.0", "tuple")])
def test_gpu_ranks_select_their_device_and_share_the_nccl_id(version, uid_type, tmp_path):
    envs = rankspawn.rank_envs(2, gpus=["4", "7"], extra={"FAKE_CUPY_VERSION": version})
    for env in envs:
        env["PYTHONPATH"] = FAKE + os.pathsep + env["PYTHONPATH"]
    result = rankspawn.Ranks(["tests/runtime_worker.py", "gpu"], envs, str(tmp_path)).wait(60)
    assert result.ok(), result
    ranks = rankspawn.results(result)
    for local_rank, r in enumerate(ranks):
        # CUDA_VISIBLE_DEVICES=4,7 renumbers the devices: FLAGS_selected_gpus is the index
        assert envs[local_rank]["CUDA_VISIBLE_DEVICES"] == "4,7"
        assert r["device"] == f"gpu:{local_rank}" and r["current_device"] == local_rank
        assert r["xp"] == "cupy" and r["uid_type"] == uid_type and r["nccl_rank"] == local_rank
    assert ranks[0]["uid"] == ranks[1]["uid"] and len(ranks[0]["uid"]) == 128


def test_without_cupy_a_gpu_rank_falls_back_to_cpu(tmp_path):
    envs = rankspawn.rank_envs(2, gpus=["0", "1"])
    for env in envs:
        env["PYTHONPATH"] = NO_CUPY + os.pathsep + env["PYTHONPATH"]
    result = rankspawn.Ranks(["tests/runtime_worker.py", "gpu"], envs, str(tmp_path)).wait(60)
    assert result.ok(), result
    for out, r in zip(result.outputs, rankspawn.results(result)):
        assert r["device"] == "cpu" and r["xp"] == "numpy"
        assert "CuPy is not installed; running on CPU" in out
