"""fluidctl shard-data's engine in-process: shard contents, manifest, options, staging and the
worker pool. The CLI (exit codes, messages, bad input, full disks, signals) runs as a real
subprocess in tests/e2e/test_shard_data_cli.py."""
import gzip
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fluidctl import sharding
from fluidctl.errors import UsageError
from fluidctl.sharding import ShardOptions

from shardutil import (check_manifest_matches_files, listing, run, shard_files, text_input,
                       write_lines)


@pytest.fixture
def text(tmp_path):
    return text_input(tmp_path)


def lines_of(path):
    return Path(path).read_bytes().splitlines(keepends=True)


# --- --by lines ------------------------------------------------------------------------------
def test_lines_concatenate_to_the_input_and_balance_bytes(text, tmp_path):
    out = tmp_path / "shards"
    run([text], 4, out)
    manifest, files = check_manifest_matches_files(out)
    assert [f.name for f in files] == [f"train.txt-0000{i}" for i in range(4)]
    assert b"".join(f.read_bytes() for f in files) == text.read_bytes()
    longest = max(len(line) for line in lines_of(text))
    for f in files:
        assert abs(f.stat().st_size - text.stat().st_size / 4) <= longest
        assert f.read_bytes().endswith(b"\n")
    assert manifest["trainers"] == 4 and manifest["records"] == 1000
    assert manifest["inputs"][0]["path"] == str(text)
    assert manifest["options"]["by"] == "lines"
    assert listing(out) == sorted([f.name for f in files] + ["manifest.json"])


def test_missing_final_newline_kept_and_added_between_inputs(tmp_path):
    a = write_lines(tmp_path / "a.txt", [b"a1", b"a2", b"a3"], end=b"")
    b = write_lines(tmp_path / "b.txt", [b"b1", b"b2", b"b3"], end=b"")
    out = tmp_path / "out"
    run([a, b], 3, out)
    _, files = check_manifest_matches_files(out)
    assert b"".join(f.read_bytes() for f in files) == b"a1\na2\na3\nb1\nb2\nb3"


def test_a_record_longer_than_a_share_still_gives_every_shard_a_record(tmp_path):
    big = write_lines(tmp_path / "big.txt", [b"y" * 5000, b"s1", b"s2", b"s3"])
    out = tmp_path / "out"
    manifest = run([big], 4, out)
    assert [s["records"] for s in manifest["shards"]] == [1, 1, 1, 1]


def test_directory_and_glob_inputs_sorted_hidden_skipped(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    write_lines(data / "b.txt", [b"b"])
    write_lines(data / "a.txt", [b"a"])
    write_lines(data / "sub" / "c.txt", [b"c"])
    write_lines(data / ".hidden", [b"h"])
    run([data], 1, tmp_path / "o1")
    assert (tmp_path / "o1" / "a.txt-00000").read_bytes() == b"a\nb\nc\n"
    run([str(data / "*.txt")], 1, tmp_path / "o2", name="g")
    assert (tmp_path / "o2" / "g-00000").read_bytes() == b"a\nb\n"


def test_gzip_input_read_transparently(text, tmp_path):
    gz = tmp_path / "train.txt.gz"
    gz.write_bytes(gzip.compress(text.read_bytes()))
    out = tmp_path / "out"
    manifest = run([gz], 3, out)
    _, files = check_manifest_matches_files(out)
    assert files[0].name == "train.txt-00000"               # .gz dropped from the name
    assert b"".join(f.read_bytes() for f in files) == text.read_bytes()
    assert manifest["inputs"][0]["gzip"] is True
    assert listing(out) == sorted([f.name for f in files] + ["manifest.json"])  # no spool


def test_csv_header_in_every_shard(tmp_path):
    rows = [b"%d,%d" % (i, i * i) for i in range(100)]
    a = write_lines(tmp_path / "a.csv", [b"n,square"] + rows[:60])
    b = write_lines(tmp_path / "b.csv", [b"n,square"] + rows[60:])
    out = tmp_path / "out"
    manifest = run([a, b], 3, out, format="csv")
    _, files = check_manifest_matches_files(out)
    body = []
    for f in files:
        got = lines_of(f)
        assert got[0] == b"n,square\n"
        body += got[1:]
    assert body == [r + b"\n" for r in rows]
    assert manifest["header"] == "n,square" and manifest["records"] == 100


def test_jsonl_checked_and_sharded(tmp_path):
    good = write_lines(tmp_path / "d.jsonl", [json.dumps({"i": i}).encode() for i in range(50)])
    manifest = run([good], 2, tmp_path / "out", format="jsonl")
    assert manifest["records"] == 50


# --- --by files ------------------------------------------------------------------------------
def test_by_files_whole_files_largest_first(tmp_path):
    sizes = {"f1": 50, "f2": 40, "f3": 30, "f4": 20, "f5": 10}
    paths = [write_lines(tmp_path / n, [b"%s-%d" % (n.encode(), k) for k in range(c)])
             for n, c in sizes.items()]
    out = tmp_path / "out"
    run(paths, 2, out, by="files")
    _, files = check_manifest_matches_files(out)
    # greedy: f1->0, f2->1, f3->1 (40<50), f4->0 (50<70), f5->0 or 1 (70 vs 70: lowest index)
    expect = [[b"f1", b"f4", b"f5"], [b"f2", b"f3"]]
    for f, names in zip(files, expect):
        data = f.read_bytes()
        assert data == b"".join(Path(tmp_path / n.decode()).read_bytes() for n in names)


def test_by_files_needs_a_file_per_trainer(tmp_path):
    a = write_lines(tmp_path / "a", [b"1", b"2"])
    with pytest.raises(UsageError, match="2 trainers but only 1 non-empty input file"):
        run([a], 2, tmp_path / "out", by="files")


# --- shuffle and equalize --------------------------------------------------------------------
def test_shuffle_is_a_seeded_permutation_with_equal_counts(text, tmp_path, monkeypatch):
    monkeypatch.setattr(sharding.tuning, "BUCKET_MAX_BYTES", 4096)    # force re-scatter of buckets
    monkeypatch.setattr(sharding.tuning, "BUCKET_MAX_RECORDS", 100)
    outs = {}
    for label, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = tmp_path / label
        manifest = run([text], 3, out, shuffle=True, seed=seed)
        check_manifest_matches_files(out)
        assert sorted(s["records"] for s in manifest["shards"]) == [333, 333, 334]
        outs[label] = b"".join(f.read_bytes() for f in shard_files(out)[1])
        assert listing(out) == sorted([f"train.txt-0000{i}" for i in range(3)] + ["manifest.json"])
    assert Counter(outs["a"].splitlines()) == Counter(text.read_bytes().splitlines())
    assert outs["a"] != text.read_bytes()
    assert outs["a"] == outs["b"]
    assert outs["a"] != outs["c"]


@pytest.mark.parametrize("block", [1 << 20, 64])    # 64: records span the pieces pad reads
def test_equalize_pad_resamples_from_the_shard_itself(text, tmp_path, monkeypatch, block):
    monkeypatch.setattr(sharding.tuning, "BLOCK", block)
    plain, padded = tmp_path / "plain", tmp_path / "padded"
    run([text], 3, plain)
    manifest = run([text], 3, padded, equalize="pad", seed=3)
    _, files = check_manifest_matches_files(padded)
    counts = [s["records"] for s in manifest["shards"]]
    assert len(set(counts)) == 1
    for before, after in zip(shard_files(plain)[1], files):
        original = before.read_bytes()
        assert after.read_bytes().startswith(original)
        added = after.read_bytes()[len(original):].splitlines()
        assert len(added) == counts[0] - len(original.splitlines())
        assert set(added) <= set(original.splitlines())
        assert len(set(added)) == len(added)          # without replacement while it can
    assert run([text], 3, tmp_path / "again", equalize="pad", seed=3)["shards"] == manifest["shards"]


def test_equalize_truncate_cuts_to_the_smallest(text, tmp_path):
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    run([text], 3, plain)
    manifest = run([text], 3, cut, equalize="truncate")
    _, files = check_manifest_matches_files(cut)
    smallest = min(len(lines_of(f)) for f in shard_files(plain)[1])
    assert [s["records"] for s in manifest["shards"]] == [smallest] * 3
    for before, after in zip(shard_files(plain)[1], files):
        assert before.read_bytes().startswith(after.read_bytes())


def test_pad_with_shuffle_and_csv(tmp_path):
    path = write_lines(tmp_path / "t.csv", [b"h"] + [b"%d" % i for i in range(10)])
    manifest = run([path], 4, tmp_path / "out", format="csv", shuffle=True, equalize="pad")
    _, files = check_manifest_matches_files(tmp_path / "out")
    assert [s["records"] for s in manifest["shards"]] == [3, 3, 3, 3]
    assert all(lines_of(f)[0] == b"h\n" for f in files)


# --- naming, force, checksum, CLI output -----------------------------------------------------
def test_name_suffix_length_and_checksum_none(text, tmp_path):
    out = tmp_path / "out"
    manifest = run([text], 2, out, name="part", suffix_length=3, checksum="none")
    assert [s["file"] for s in manifest["shards"]] == ["part-000", "part-001"]
    assert all(s["digest"] is None and s["checksum"] is None for s in manifest["shards"])


@pytest.mark.parametrize("algorithm", ["xxh3-128", "blake3", "sha256"])
def test_manifest_names_the_algorithm_of_every_digest(text, tmp_path, algorithm):
    manifest = run([text], 3, tmp_path / "out", checksum=algorithm)
    assert manifest["options"]["checksum"] == algorithm
    assert {s["checksum"] for s in manifest["shards"]} == {algorithm}
    check_manifest_matches_files(tmp_path / "out")
    if algorithm == "sha256":       # what sha256sum checks, byte for byte
        for s in manifest["shards"]:
            data = (tmp_path / "out" / s["file"]).read_bytes()
            assert s["digest"] == hashlib.sha256(data).hexdigest()


def test_default_digest_is_xxh3_128(text, tmp_path):
    manifest = run([text], 2, tmp_path / "out")
    assert [s["checksum"] for s in manifest["shards"]] == ["xxh3-128", "xxh3-128"]
    assert all(len(s["digest"]) == 32 for s in manifest["shards"])


@pytest.mark.parametrize("counter", ["stringzilla", "numpy", "bytes.count"])
def test_every_newline_counter_gives_the_same_manifest(tmp_path, monkeypatch, counter):
    """StringZilla counts by default; without it a loaded numpy does, else bytes.count: the
    records and digests must not depend on which. Pieces of 4 KiB + 7 bytes put cuts and piece
    ends everywhere inside lines."""
    from fluidctl.sharding import scan
    lines = [b"r%d %s" % (i, b"z" * (i % 97)) for i in range(20000)]
    path = write_lines(tmp_path / "t.txt", lines)
    reference = run([path], 3, tmp_path / "ref")
    monkeypatch.setattr(sharding.tuning, "COPY_BLOCK", 4096 + 7)
    if counter != "stringzilla":
        monkeypatch.setattr(scan, "_sz", False)
    if counter == "numpy":
        monkeypatch.setattr(sharding.tuning, "NUMPY_FROM", 0)
    else:
        monkeypatch.setattr(sharding.tuning, "NUMPY_FROM", 1 << 40)
    other = run([path], 3, tmp_path / "other")
    assert other["shards"] == reference["shards"]
    assert sum(s["records"] for s in other["shards"]) == 20000
    _, files = check_manifest_matches_files(tmp_path / "other")
    assert b"".join(f.read_bytes() for f in files) == path.read_bytes()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 64))
def test_count_newlines_is_bytes_count(data, slack):
    """The table-and-sum count against CPython's, on any bytes (newline runs, 0x0a next to
    0x0b/0x8a, empty), through a scratch buffer larger than the data, and without one."""
    from fluidctl.sharding.scan import count_newlines
    scratch = bytearray(len(data) + slack)
    assert count_newlines(memoryview(data), scratch) == data.count(b"\n")
    assert count_newlines(data) == data.count(b"\n")


def test_shuffle_reaches_every_permutation(tmp_path, monkeypatch):
    """4 records through scatter + re-scatter + in-bucket shuffle: all 24 orders show up."""
    monkeypatch.setattr(sharding.tuning, "BUCKET_MAX_RECORDS", 2)       # every level recurses
    src = sharding.Source("r", str(write_lines(tmp_path / "r", [b"a", b"b", b"c", b"d"])), 8,
                          size=8)
    seen = Counter()
    for seed in range(300):
        work = tmp_path / f"w{seed}"
        work.mkdir()
        got = []

        class Writer:
            def write(self, data):
                got.append(bytes(data))

            def close(self):
                pass

        opts = ShardOptions(["r"], 1, "unused", shuffle=True)
        sharding.shuffle_shards([src], opts, str(work), lambda i: Writer(), sharding.Progress(),
                                np.random.default_rng(seed))
        seen[b"".join(got)] += 1
        assert sorted(os.listdir(work)) == ["shuffle"] and not os.listdir(work / "shuffle")
    assert len(seen) == 24 and min(seen.values()) >= 3


def test_pad_beyond_the_shard_size_repeats_every_record(tmp_path):
    path = write_lines(tmp_path / "t", [b"y" * 100, b"a", b"b", b"c", b"d", b"e"])
    manifest = run([path], 2, tmp_path / "out", equalize="pad")
    _, files = check_manifest_matches_files(tmp_path / "out")
    assert [s["records"] for s in manifest["shards"]] == [5, 5]
    assert files[0].read_bytes() == (b"y" * 100 + b"\n") * 5


def test_tiny_pieces_write_the_same_bytes(text, tmp_path, monkeypatch):
    monkeypatch.setattr(sharding.tuning, "COPY_BLOCK", 5)
    out = tmp_path / "out"
    run([text], 3, out)
    _, files = check_manifest_matches_files(out)
    assert b"".join(f.read_bytes() for f in files) == text.read_bytes()


def test_an_input_changed_during_the_copy_is_refused(text, tmp_path, monkeypatch):
    """The kernel copies a shard while another thread reads it for the digest and the count: an
    input rewritten meanwhile could make them disagree, so the run fails, naming the input,
    and leaves nothing behind."""
    real = sharding.ShardWriter.tally_range

    def tally_then_touch(self, path, start, end, stop):
        real(self, path, start, end, stop)
        with open(path, "r+b") as f:                     # same size, other bytes
            f.write(b"X")

    monkeypatch.setattr(sharding.ShardWriter, "tally_range", tally_then_touch)
    with pytest.raises(UsageError, match=r"input .*train.txt changed while being sharded"):
        run([text], 2, tmp_path / "out")
    assert listing(tmp_path) == ["train.txt"]


def test_staging_removes_a_tree_without_following_its_symlinks(tmp_path):
    """The replaced output and stale staging directories are removed through directory
    descriptors: nested directories go, a symlink inside is unlinked (its target kept), and a
    symlink given as the tree itself is refused, as shutil.rmtree refuses it."""
    from fluidctl.sharding import staging
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    tree = tmp_path / ".shards.abc.old"
    (tree / "previous" / "deeper").mkdir(parents=True)
    (tree / "previous" / "part-00000").write_text("x")
    (tree / "previous" / "deeper" / "y").write_text("y")
    os.symlink(outside, tree / "previous" / "link-to-outside")
    os.symlink(outside / "keep.txt", tree / "file-link")
    staging._rmtree(str(tree))
    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "mine"
    link = tmp_path / "link"
    os.symlink(outside, link)
    staging._rmtree(str(link))                      # ignore_errors, as shutil would
    assert link.is_symlink() and (outside / "keep.txt").exists()
    with pytest.raises(OSError):
        staging._rmtree(str(link), ignore_errors=False)


def test_parallel_tasks_return_in_order_and_the_first_failure_stops_the_rest():
    """The engine's worker pool (fluidctl.sharding.parallel, on _thread): results come back by
    task index; a failure sets the stop flag a running task sees, tasks not yet started never
    start, and the lowest failing index is the error raised."""
    import threading
    from fluidctl.sharding.parallel import _parallel
    assert _parallel(lambda i, stop: i * i, 7) == [0, 1, 4, 9, 16, 25, 36]
    assert _parallel(lambda i, stop: i, 0) == []
    started, seen_stop = [], threading.Event()

    def task(i, stop):
        started.append(i)
        if i == 0:                   # runs beside task 1 and waits for its failure
            for _ in range(500):
                if stop.is_set():
                    seen_stop.set()
                    return i
                threading.Event().wait(0.01)
            return i
        raise ValueError(f"task {i}")
    with pytest.raises(ValueError, match="task 1"):
        _parallel(task, 50)
    if (os.cpu_count() or 1) > 1:
        assert seen_stop.is_set()
    assert sorted(started) == [0, 1]             # the rest never started


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text() | st.integers() | st.booleans() | st.none() | st.floats(),
                      children, max_size=4),
    max_leaves=25)


@settings(max_examples=150, deadline=None)      # ~15 ms an example: drawing nested values
@given(JSON_VALUES)
def test_the_manifest_writer_is_json_dumps_with_indent_2(value):
    """The manifest is written without importing json (re, enum: ~4 ms of a small run): byte
    for byte what json.dumps(indent=2) writes, surrogates, NaN and non-str keys included."""
    import json
    from fluidctl.sharding.manifest import to_json
    assert to_json(value) == json.dumps(value, indent=2)
