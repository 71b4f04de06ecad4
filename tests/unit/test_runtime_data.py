"""fluidctl.runtime.data: a trainer finds its shard from the environment contract and reads it
in batches; a shard count that does not match the trainer count is a clear error. Real trainer
processes: tests/e2e/test_runtime_data_ranks.py."""
import gzip
import json
from pathlib import Path

import pytest

from fluidctl import envs, sharding
from fluidctl.errors import UsageError
from fluidctl.runtime import data
from fluidctl.sharding import ShardOptions
from shardutil import four_shards


def env_of(rank, world):
    return {envs.TRAINER_ID: str(rank), envs.TRAINERS_NUM: str(world)}


@pytest.fixture
def shards(tmp_path):
    return four_shards(tmp_path)


def test_shard_path_follows_the_trainer_id(shards):
    for rank in range(4):
        path = data.shard_path(str(shards), environ=env_of(rank, 4))
        assert path == str(shards / f"train.txt-{rank:05d}")


def test_count_mismatch_names_both_numbers(shards):
    with pytest.raises(UsageError) as err:
        data.shard_path(str(shards), environ=env_of(0, 3))
    text = err.value.one_line()
    assert "holds 4 shard(s)" in text and "3 trainer(s)" in text and "--trainers 3" in text


def test_rank_outside_world_is_an_error(shards):
    with pytest.raises(UsageError, match="trainer id 5 is outside 0..3"):
        data.shard_path(str(shards), environ=env_of(5, 4))


def test_numbered_files_without_manifest_glob_and_rank_pattern(tmp_path):
    for i in range(3):
        (tmp_path / f"part-{i:05d}").write_text(f"{i}\n")
    (tmp_path / "README").write_text("not a shard\n")
    assert data.shard_path(str(tmp_path), environ=env_of(2, 3)) == str(tmp_path / "part-00002")
    assert data.shard_path(str(tmp_path / "part-*"), environ=env_of(1, 3)) == \
        str(tmp_path / "part-00001")
    assert data.shard_path(str(tmp_path / "part-{rank:05d}"), environ=env_of(0, 7)) == \
        str(tmp_path / "part-00000")
    with pytest.raises(UsageError, match="holds 3 shard"):
        data.shard_path(str(tmp_path), environ=env_of(0, 2))
    (tmp_path / "part-00004").write_text("gap\n")
    with pytest.raises(UsageError, match="not numbered 0..3"):
        data.shard_paths(str(tmp_path))
    with pytest.raises(UsageError, match="no shards found"):
        data.shard_paths(str(tmp_path / "nothing-*"))


def test_reader_batches_and_len_from_manifest(shards):
    seen = []
    for rank in range(4):
        reader = data.ShardReader(str(shards), batch_size=10, environ=env_of(rank, 4))
        records = json.loads((shards / "manifest.json").read_text())["shards"][rank]["records"]
        got = list(reader)
        assert len(got) == len(reader) == -(-records // 10)
        assert all(len(b) == 10 for b in got[:-1])
        seen += [r for b in got for r in b]
        dropped = data.ShardReader(str(shards), batch_size=10, drop_last=True,
                                   environ=env_of(rank, 4))
        assert len(list(dropped)) == len(dropped) == records // 10
    assert seen == [f"line {i}" for i in range(103)]


def test_csv_jsonl_gzip_records(tmp_path):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text('a,b\n1,"x,y"\n2,z\n')
    assert list(data.iter_records(str(csv_path), "csv")) == [["1", "x,y"], ["2", "z"]]
    jl = tmp_path / "t.jsonl.gz"
    jl.write_bytes(gzip.compress(b'{"k": 1}\n{"k": 2}\n'))
    assert list(data.iter_records(str(jl), "jsonl")) == [{"k": 1}, {"k": 2}]
    assert list(data.batches(range(5), 2)) == [[0, 1], [2, 3], [4]]
    assert list(data.batches(range(5), 2, drop_last=True)) == [[0, 1], [2, 3]]
    with pytest.raises(UsageError, match="batch size"):
        list(data.batches([], 0))


def test_format_comes_from_the_manifest(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("n,sq\n" + "".join(f"{i},{i*i}\n" for i in range(6)))
    out = tmp_path / "out"
    sharding.shard(ShardOptions([str(src)], 2, str(out), format="csv"))
    path = data.shard_path(str(out), environ=env_of(1, 2))
    assert list(data.iter_records(path)) == [["4", "16"], ["5", "25"]]   # bytes 13 of 26: after "3,9"


def test_verify_detects_a_changed_shard(shards):
    path = data.shard_path(str(shards), environ=env_of(1, 4), verify=True)
    content = Path(path).read_bytes()
    Path(path).write_bytes(content.replace(b"line", b"LINE", 1))
    with pytest.raises(UsageError, match="does not match the xxh3-128 digest"):
        data.shard_path(str(shards), environ=env_of(1, 4), verify=True)
    Path(path).write_bytes(content + b"more\n")
    with pytest.raises(UsageError, match="the manifest says"):
        data.verify_shard(path)


def test_shard_reader_verify_names_a_flipped_byte(shards):
    assert len(data.ShardReader(str(shards), 4, environ=env_of(2, 4), verify=True)) > 0
    path = shards / "train.txt-00002"
    content = bytearray(path.read_bytes())
    content[5] ^= 0x20                      # same size: only the digest can tell
    path.write_bytes(bytes(content))
    with pytest.raises(UsageError) as err:
        data.ShardReader(str(shards), 4, environ=env_of(2, 4), verify=True)
    assert f"shard {path} does not match the xxh3-128 digest" in err.value.one_line()
    data.ShardReader(str(shards), 4, environ=env_of(1, 4), verify=True)    # others are fine
    data.ShardReader(str(shards), 4, environ=env_of(2, 4))                 # not asked: no read


