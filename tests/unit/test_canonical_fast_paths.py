"""The canonical reader's fast paths give what the plain ones give: the numpy order equals the
scalar order, the offset index shard-data writes equals a scan of the shard, a reader reads the
same records with the index, without it, and with one that no longer fits its shard; --verify
checks the index too."""
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fluidctl.errors import UsageError
from fluidctl.runtime import order, orderwindow, recordindex
from fluidctl.runtime.data import ShardReader, verify_dir
from shardutil import run, write_lines


@settings(max_examples=60, deadline=None)
@given(n=st.one_of(st.integers(1, 40), st.integers(order.SMALL - 2, order.SMALL + 3),
                   st.integers(1025, 300_000)), key=st.integers(0, 2**64 - 1))
def test_vectorised_permutation_equals_the_scalar_one(n, key):
    perm = order.Permutation(n, key)
    items = np.unique(np.linspace(0, n - 1, num=min(n, 500)).astype(np.uint64))
    assert orderwindow.permute(perm, items).tolist() == [perm(int(i)) for i in items.tolist()]


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(1, 3000), min_size=1, max_size=6), seed=st.integers(0, 99),
       epoch=st.integers(0, 3), shuffle=st.booleans(), step=st.integers(1, 7))
def test_vectorised_samples_equal_the_scalar_order(counts, seed, epoch, shuffle, step):
    epoch_order = order.EpochOrder(counts, seed, epoch, shuffle)
    positions = np.arange(step // 2, epoch_order.total, step, dtype=np.int64)
    _, shards, records = orderwindow.samples(epoch_order, positions)
    assert list(zip(shards.tolist(), records.tolist())) == \
        [epoch_order.sample(p) for p in positions.tolist()]


def _records(directory):
    """Every rank's records, rank 0's first, of one epoch at 3 ranks."""
    return [r for rank in range(3)
            for b in ShardReader(str(directory), 3, seed=4, rank=rank, world=3) for r in b]


def test_the_offset_index_matches_a_scan_and_is_optional(tmp_path):
    lines = [b"r%d%s" % (i, b"\r" * (i % 3 == 0)) for i in range(700)] + [b"", b"last"]
    src = write_lines(tmp_path / "data.txt", lines)
    with open(src, "ab") as f:
        f.write(b"no-newline")                              # an unterminated last record
    out = tmp_path / "canon"
    run([src], 4, out, canonical=True)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        offsets = entry["offsets"]
        assert offsets["file"] == f"offsets/{entry['file']}.idx"
        stored = np.fromfile(out / offsets["file"], dtype="<u8")
        data = np.fromfile(out / entry["file"], dtype=np.uint8)
        assert stored.tolist() == recordindex.line_starts(data).tolist()
        assert len(stored) == entry["records"] + 1 and offsets["bytes"] == 8 * len(stored)
    assert verify_dir(str(out)) == []
    with_index = _records(out)
    expected = [line.decode().rstrip("\r\n") for line in open(src, "rb")]
    assert sorted(with_index) == sorted(expected)
    first = out / manifest["shards"][0]["offsets"]["file"]
    first.write_bytes(first.read_bytes()[:-8])                   # no longer fits: scanned
    assert _records(out) == with_index
    assert any("offsets/" in p for p in verify_dir(str(out)))
    for entry in manifest["shards"]:                             # an older directory: none
        del entry["offsets"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    for path in (out / "offsets").iterdir():
        path.unlink()
    assert _records(out) == with_index and verify_dir(str(out)) == []


def test_csv_index_skips_the_header_and_a_truncated_shard_is_still_named(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(50)))
    run([table], 3, tmp_path / "c", canonical=True, format="csv")
    shard = tmp_path / "c" / "t.csv-00001"
    offsets = np.fromfile(tmp_path / "c" / "offsets" / "t.csv-00001.idx", dtype="<u8")
    assert offsets[0] == len("a,b\n") and offsets[-1] == shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-15])
    with pytest.raises(UsageError, match=f"shard {shard} holds .* record"):
        list(ShardReader(str(tmp_path / "c"), 50, shuffle=False, rank=0, world=1))


def test_long_records_read_in_smaller_windows(tmp_path):
    src = write_lines(tmp_path / "big.txt", [b"%d:" % i + b"y" * 4000 for i in range(3000)])
    run([src], 2, tmp_path / "b", canonical=True)
    reader = ShardReader(str(tmp_path / "b"), 5, seed=1, rank=0, world=2)
    assert reader._global._window_records() < 16384
    got = [r.split(":")[0] for b in reader for r in b]
    everything = [r.split(":")[0] for b in ShardReader(str(tmp_path / "b"), 5, seed=1, rank=1,
                                                         world=2) for r in b] + got
    assert sorted(everything, key=int) == [str(i) for i in range(3000)]
    assert os.path.isdir(tmp_path / "b" / "offsets")


def test_plain_shards_with_an_unterminated_last_record(tmp_path):
    src = tmp_path / "plain.txt"
    src.write_bytes(b"\n".join(b"p%d" % i for i in range(40)))       # no CR, no final LF
    run([src], 3, tmp_path / "p", canonical=True)
    assert sorted(_records(tmp_path / "p")) == sorted(f"p{i}" for i in range(40))


def test_an_index_of_the_right_size_but_wrong_offsets_is_not_trusted(tmp_path):
    src = write_lines(tmp_path / "w.txt", [b"w%d" % i for i in range(90)])
    run([src], 2, tmp_path / "w", canonical=True)
    expected = _records(tmp_path / "w")
    index = tmp_path / "w" / "offsets" / "w.txt-00000.idx"
    good = np.fromfile(index, dtype="<u8")
    for bad in (good[[0, 2, 1, *range(3, good.size)]], good + np.uint64(1),
                np.concatenate([good[:5], good[5:-1] + np.uint64(1), good[-1:]])):
        index.write_bytes(bad.astype("<u8").tobytes())
        assert _records(tmp_path / "w") == expected
