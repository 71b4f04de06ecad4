"""A shard's checkpoint: everything comes back (dense, optimizer state, sparse rows and their
state), damage is detected, and a directory is never shared by two servers."""
import json

import numpy as np
import pytest

from fluidctl.runtime import optim
from fluidctl.runtime.pserver import checkpoint
from fluidctl.runtime.pserver.shard import ShardState


def trained_shard():
    s = ShardState(trainers=1, sync=False, pserver_id=3)
    s.register(0, sync=False, opt_config=optim.Adam(0.1).config(), fingerprint=42,
               dense=[("w.block1", np.dtype("<f4"), (3, 2))],
               init_values=[np.arange(6, dtype=np.float32).reshape(3, 2)],
               sparse=[{"name": "emb", "dim": 4, "dict_size": 50, "dtype": "<f8",
                        "init": "uniform", "scale": 0.1, "seed": 1}], timeout=1)
    for i in range(3):
        s.push_async(["w.block1"], [np.full((3, 2), i + 1, np.float32)])
        s.sparse_push("emb", np.array([7, -2, 7 + i]), np.ones((3, 4)))
    return s


def test_round_trip(tmp_path):
    s = trained_shard()
    with s.cond:
        checkpoint.save(s, tmp_path)
    back = ShardState(trainers=1, sync=False, pserver_id=3)
    manifest = checkpoint.load(back, tmp_path)
    assert manifest["step"] == back.step == 3 and back.fingerprint == 42
    assert back.opt.config() == s.opt.config()
    assert np.array_equal(back.dense["w.block1"], s.dense["w.block1"])
    for slot in ("m", "v", "t"):
        assert np.array_equal(back.opt.state["w.block1"][slot], s.opt.state["w.block1"][slot])
    ids = np.array([7, -2, 8, 9])
    assert np.array_equal(back.sparse_pull("emb", ids), s.sparse_pull("emb", ids))
    # continuing from the checkpoint is the same as never having stopped
    for shard in (s, back):
        shard.push_async(["w.block1"], [np.ones((3, 2), np.float32)])
        shard.sparse_push("emb", np.array([7]), np.ones((1, 4)))
    assert np.array_equal(back.dense["w.block1"], s.dense["w.block1"])
    assert np.array_equal(back.sparse_pull("emb", ids), s.sparse_pull("emb", ids))


def test_only_the_newest_data_file_is_kept_and_no_temp_files_remain(tmp_path):
    s = trained_shard()
    with s.cond:
        checkpoint.save(s, tmp_path)
        s.step += 1
        checkpoint.save(s, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["manifest.json", "shard-0000000004.bin"]


def test_no_checkpoint_yet_is_none_and_a_cut_short_save_is_cleaned_up(tmp_path):
    (tmp_path / ".shard-0000000009.bin.tmp").write_bytes(b"partial")
    assert checkpoint.load(ShardState(1), tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_corruption_is_detected(tmp_path):
    s = trained_shard()
    with s.cond:
        checkpoint.save(s, tmp_path)
    data = next(tmp_path.glob("shard-*.bin"))
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        checkpoint.load(ShardState(1), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["arrays"][0]["dtype"] = "|O"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointError, match="not a plain numeric type"):
        checkpoint.load(ShardState(1), tmp_path)


def test_a_shard_directory_is_locked(tmp_path):
    d = checkpoint.shard_dir(tmp_path, 0)
    fd = checkpoint.lock_dir(d)
    with pytest.raises(checkpoint.CheckpointError, match="in use"):
        checkpoint.lock_dir(d)
    other = checkpoint.lock_dir(checkpoint.shard_dir(tmp_path, 1))
    import os
    os.close(fd)
    os.close(other)
    os.close(checkpoint.lock_dir(d))
