"""Helpers of the shard-data tests (tests/unit/test_shard_data.py and
tests/e2e/test_shard_data_cli.py): shard in-process, read a manifest, write and list inputs."""
import json
import os
from pathlib import Path

from fluidctl import digest, sharding
from fluidctl.sharding import ShardOptions


def run(inputs, trainers, out, **kw):
    return sharding.shard(ShardOptions([str(i) for i in inputs], trainers, str(out), **kw))


def shard_files(out):
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    return manifest, [Path(out) / s["file"] for s in manifest["shards"]]


def write_lines(path, lines, end=b"\n"):
    Path(path).write_bytes(b"\n".join(lines) + end)
    return Path(path)


def check_manifest_matches_files(out):
    manifest, files = shard_files(out)
    for entry, path in zip(manifest["shards"], files):
        data = path.read_bytes()
        assert entry["bytes"] == len(data)
        if entry["checksum"] is not None:
            hasher = digest.new(entry["checksum"])
            hasher.update(data)
            assert entry["digest"] == hasher.hexdigest()
        header = 1 if manifest["format"] == "csv" else 0
        assert entry["records"] == len(data.splitlines()) - header
    assert manifest["records"] == sum(s["records"] for s in manifest["shards"])
    return manifest, files


def text_input(tmp_path):
    """1000 records of varying length, 'rec-<n> <padding>'."""
    lines = [b"rec-%d %s" % (i, b"x" * (i * 7 % 50)) for i in range(1000)]
    return write_lines(tmp_path / "train.txt", lines)


def listing(directory):
    return sorted(os.listdir(directory))


def four_shards(tmp_path):
    """103 numbered lines sharded for 4 trainers (the runtime data tests' input)."""
    src = tmp_path / "train.txt"
    src.write_text("".join(f"line {i}\n" for i in range(103)))
    out = tmp_path / "shards"
    sharding.shard(ShardOptions([str(src)], 4, str(out)))
    return out
