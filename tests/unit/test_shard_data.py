"""fluidctl shard-data: shard contents, manifest, options, and every bad input (one line, exit 2,
nothing left behind). The engine is called in-process where only its output matters; the CLI
runs as a real subprocess where exit codes and messages are the point."""
import gzip
import hashlib
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fluidctl import sharding
from fluidctl.errors import UsageError
from fluidctl import digest
from fluidctl.sharding import ShardOptions

from launchutil import default_sigint


# --- helpers ---------------------------------------------------------------------------------
def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fluidctl", "shard-data", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def run(inputs, trainers, out, **kw):
    return sharding.shard(ShardOptions([str(i) for i in inputs], trainers, str(out), **kw))


def shard_files(out):
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    return manifest, [Path(out) / s["file"] for s in manifest["shards"]]


def lines_of(path):
    return Path(path).read_bytes().splitlines(keepends=True)


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


def assert_one_line_error(result, *words):
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


@pytest.fixture
def text(tmp_path):
    """1000 records of varying length, 'rec-<n> <padding>'."""
    lines = [b"rec-%d %s" % (i, b"x" * (i * 7 % 50)) for i in range(1000)]
    return write_lines(tmp_path / "train.txt", lines)


def listing(directory):
    return sorted(os.listdir(directory))


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
        import numpy  # noqa: F401  (loaded: the numpy count is used)
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


# --- --verify --------------------------------------------------------------------------------
def flip_byte(path, offset):
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x01
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize("algorithm", ["xxh3-128", "blake3", "sha256"])
def test_verify_finds_and_names_a_flipped_byte(text, tmp_path, algorithm):
    out = tmp_path / "out"
    result = cli(text, "-n", "3", "-o", out, "-q", "--checksum", algorithm)
    assert result.returncode == 0, result.stderr
    ok = cli("--verify", out)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == f"ok: 3 shard(s) in {out} match the manifest ({algorithm})\n"
    _, files = shard_files(out)
    flip_byte(files[1], 17)             # same size: only the digest can tell
    bad = cli("--verify", out)
    assert bad.returncode == 1, bad
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: "), bad.stderr
    assert f"shard {files[1]} does not match the {algorithm} digest" in bad.stderr
    assert str(files[0]) not in bad.stderr and str(files[2]) not in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""


def test_verify_names_every_bad_shard_on_one_line(text, tmp_path):
    out = tmp_path / "out"
    run([text], 4, out)
    _, files = shard_files(out)
    flip_byte(files[0], 0)
    files[2].write_bytes(files[2].read_bytes()[:-1])          # truncated
    files[3].unlink()
    bad = cli("--verify", out)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert "3 shard(s) differ" in bad.stderr
    assert f"shard {files[0]} does not match the xxh3-128 digest" in bad.stderr
    assert f"shard {files[2]} has " in bad.stderr and "the manifest says" in bad.stderr
    assert f"shard {files[3]} is missing" in bad.stderr
    assert str(files[1]) not in bad.stderr


def test_verify_reads_version_1_manifests(text, tmp_path):
    """Shards made before the digest became per-algorithm: "sha256": hex is still checked."""
    out = tmp_path / "out"
    run([text], 2, out, checksum="sha256")
    manifest, files = shard_files(out)
    manifest["manifest_version"] = 1
    for s in manifest["shards"]:
        s["sha256"] = s.pop("digest")
        del s["checksum"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert cli("--verify", out).returncode == 0
    flip_byte(files[0], 3)
    bad = cli("--verify", out)
    assert bad.returncode == 1 and "does not match the sha256 digest" in bad.stderr


@pytest.mark.parametrize("args, words", [
    (["--verify", "{out}", "-n", "2"], ["--verify DIR checks existing shards"]),
    (["--verify", "{tmp}/nope"], ["is not a directory"]),
    (["--verify", "{tmp}"], ["has no manifest.json"]),
    (["-n", "2", "-o", "{out}"], ["missing INPUT"]),
    (["{text}", "-o", "{out}"], ["missing option --trainers"]),
    (["{text}", "-n", "2"], ["missing option -o/--output"]),
])
def test_verify_and_missing_arguments_are_usage_errors(text, tmp_path, args, words):
    out = tmp_path / "out"
    run([text], 2, out)
    argv = [a.format(out=out, tmp=tmp_path, text=text) for a in args]
    assert_one_line_error(cli(*argv), *words)


def test_force_replaces_and_refusal_keeps_old(text, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("keep me")
    result = cli(text, "-n", "2", "-o", out)
    assert_one_line_error(result, "already exists", "--force")
    assert listing(out) == ["old"]
    result = cli(text, "-n", "2", "-o", out, "--force")
    assert result.returncode == 0, result.stderr
    assert "old" not in listing(out) and "manifest.json" in listing(out)
    assert listing(tmp_path) == ["out", "train.txt"]


def test_cli_prints_a_table_and_no_progress_off_a_terminal(text, tmp_path):
    result = cli(text, "--trainers", "2", "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "train.txt-00001" in result.stdout and "1,000 records" in result.stdout
    assert result.stderr == ""
    quiet = cli(text, "--trainers", "2", "-o", tmp_path / "q", "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_progress_bar_on_a_terminal(text, tmp_path):
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="120")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "shard-data", str(text), "-n",
                             "2", "-o", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                            stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert b"writing shards" in seen and b"records" in seen


# --- bad input: one line, exit 2, nothing left behind ----------------------------------------
@pytest.mark.parametrize("case", [
    "missing", "empty_dir", "trainers_0", "more_trainers_than_records", "binary", "csv_header",
    "out_inside_input", "input_inside_out", "bad_json", "empty_file", "suffix_too_short",
    "bad_gzip", "twice",
])
def test_bad_input(case, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    three = write_lines(work / "three.txt", [b"1", b"2", b"3"])
    args, words = {
        "missing": ([work / "nope.txt", "-n", "2"], ["does not exist"]),
        "empty_dir": ([work / "emptydir", "-n", "2"], ["has no files"]),
        "trainers_0": ([three, "-n", "0"], ["--trainers must be at least 1"]),
        "more_trainers_than_records": ([three, "-n", "5"], ["5 trainers but only 3 record"]),
        "binary": ([work / "img.bin", "-n", "2"], ["looks binary"]),
        "csv_header": ([work / "a.csv", work / "b.csv", "-n", "2", "--format", "csv"],
                       ["CSV header of", "differs"]),
        "out_inside_input": ([work, "-n", "2", "-o", work / "sub" / "out"],
                             ["inside input directory"]),
        "input_inside_out": ([work / "three.txt", "-n", "2", "-o", work, "--force"],
                             ["inside the output"]),
        "bad_json": ([work / "d.jsonl", "-n", "2", "--format", "jsonl"],
                     ["d.jsonl:2: not valid JSON"]),
        "empty_file": ([work / "empty.txt", "-n", "1"], ["only 0 record"]),
        "suffix_too_short": ([three, "-n", "11", "--suffix-length", "1"],
                             ["cannot number 11 shards"]),
        "bad_gzip": ([work / "bad.gz", "-n", "2"], ["not a valid gzip file"]),
        "twice": ([three, three, "-n", "2"], ["given twice"]),
    }[case]
    (work / "emptydir").mkdir()
    (work / "img.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    write_lines(work / "a.csv", [b"x,y", b"1,2"])
    write_lines(work / "b.csv", [b"x,z", b"3,4"])
    write_lines(work / "d.jsonl", [b'{"a": 1}', b'{"a": ', b'{"a": 3}'])
    (work / "empty.txt").write_bytes(b"")
    (work / "bad.gz").write_bytes(gzip.compress(b"1\n2\n3\n" * 1000)[:-20])
    if "-o" not in args:
        args = args + ["-o", tmp_path / "out"]
    before = {d: listing(d) for d in (tmp_path, work)}
    result = cli(*args)
    assert_one_line_error(result, *words)
    assert {d: listing(d) for d in (tmp_path, work)} == before


def test_unwritable_output(text, tmp_path, tmpfs):
    target = tmpfs("ro", "size=1m,ro") if os.geteuid() == 0 else None
    if target is None:
        target = tmp_path / "locked"
        target.mkdir()
        target.chmod(0o500)
    result = cli(text, "-n", "2", "-o", target / "out")
    assert_one_line_error(result, "cannot write", "writable")
    assert listing(target) == []


def test_disk_full_before_writing(text, tmp_path, tmpfs):
    big = write_lines(tmp_path / "big.txt", [b"z" * 1000] * 2048)     # 2 MiB into 1 MiB
    target = tmpfs("small", "size=1m")
    result = cli(big, "-n", "2", "-o", target / "out")
    assert_one_line_error(result, "not enough space", "free some space")
    assert listing(target) == []


def test_disk_full_mid_way_while_decompressing(tmp_path, tmpfs):
    gz = tmp_path / "big.txt.gz"
    gz.write_bytes(gzip.compress(b"line of text to repeat\n" * 200_000))   # 4.6 MB unpacked
    target = tmpfs("small", "size=1m")
    result = cli(gz, "-n", "2", "-o", target / "out")
    assert_one_line_error(result, "disk full", "free some space")
    assert listing(target) == []


def test_disk_full_mid_way_in_the_copy_threads(text, tmp_path, tmpfs):
    target = tmpfs("inodes", "size=1m,nr_inodes=4")      # room for bytes, not for 8 files
    result = cli(text, "-n", "8", "-o", target / "out")
    assert_one_line_error(result, "disk full", "free some space")
    assert listing(target) == []


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs("name", "size=1m"): a small real file system, unmounted afterwards; skips the test
    when mounting is not allowed here."""
    mounted = []

    def mount(name, options):
        where = tmp_path / f"mnt-{name}"
        where.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


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


def test_copy_across_file_systems(text, tmpfs):
    """ext4 -> tmpfs: the shards land on another file system than their input."""
    target = tmpfs("roomy", "size=8m")
    result = cli(text, "-n", "3", "-o", target / "out", "-q")
    assert result.returncode == 0, result.stderr
    _, files = check_manifest_matches_files(target / "out")
    assert b"".join(f.read_bytes() for f in files) == text.read_bytes()


class _CopyFileRangeSpy:
    """The real os.copy_file_range, recording what each call gave (a byte count or an errno)."""

    def __init__(self):
        self.real = os.copy_file_range
        self.outcomes = []

    def __call__(self, *args, **kwargs):
        try:
            n = self.real(*args, **kwargs)
        except OSError as exc:
            self.outcomes.append(exc.errno)
            raise
        self.outcomes.append(n)
        return n


@pytest.mark.parametrize("where", ["same file system", "ext4 -> tmpfs"])
def test_the_kernel_copies_where_it_can_and_a_buffer_elsewhere(text, tmp_path, tmpfs,
                                                               monkeypatch, where):
    """On one file system the shards are copied by copy_file_range; across file systems the
    kernel answers EXDEV (Linux >= 5.19) and the bytes go through a buffer: the same shards,
    the same manifest either way. Big pieces against small ones put every cut inside a piece."""
    import errno
    spy = _CopyFileRangeSpy()
    monkeypatch.setattr(os, "copy_file_range", spy)
    monkeypatch.setattr(sharding.tuning, "KERNEL_COPY_BLOCK", 1000)
    out = (tmp_path if where == "same file system" else tmpfs("cfr", "size=8m")) / "out"
    manifest = run([text], 3, out, checksum="sha256")
    _, files = check_manifest_matches_files(out)
    assert b"".join(f.read_bytes() for f in files) == text.read_bytes()
    assert spy.outcomes, "copy_file_range was never tried"
    if where == "same file system":
        assert all(isinstance(o, int) and o > 0 for o in spy.outcomes), spy.outcomes
        assert len(spy.outcomes) > 3                       # KERNEL_COPY_BLOCK pieces
    else:
        assert set(spy.outcomes) == {errno.EXDEV}, spy.outcomes
    assert manifest["shards"] == run([text], 3, tmp_path / "again", checksum="sha256")["shards"]


def test_disk_full_inside_the_kernel_copy(tmp_path, tmpfs, monkeypatch):
    """Input and shards on one small file system, so copy_file_range does the copy, and the
    free-space check skipped (as if another writer took the space meanwhile): the kernel's
    ENOSPC becomes the one-line 'disk full', and nothing is left behind."""
    import errno
    from fluidctl.sharding import engine
    target = tmpfs("one-fs", "size=1m")
    data = write_lines(target / "in.txt", [b"q" * 99] * 6000)           # 600 kB of 1 MB
    spy = _CopyFileRangeSpy()
    monkeypatch.setattr(os, "copy_file_range", spy)
    monkeypatch.setattr(engine, "_check_space", lambda *a: None)
    with pytest.raises(UsageError, match="disk full"):
        run([data], 2, target / "out")
    assert errno.ENOSPC in spy.outcomes
    assert listing(target) == ["in.txt"]


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


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_leaves_nothing(tmp_path, sig, code):
    data = tmp_path / "data.txt"
    data.write_bytes(b"".join(b"record %d of the interrupted run\n" % i for i in range(1_500_000)))
    parent = tmp_path / "outs"
    parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "shard-data", str(data), "-n", "2",
                             "-o", str(parent / "out"), "--shuffle", "-q"],
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 30
    while not os.listdir(parent) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)            # poll for the staging directory: the work has started
    assert proc.poll() is None, "finished before it could be interrupted"
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code, proc.stderr.read()
    assert os.listdir(parent) == []


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


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_the_manifest_writer_is_json_dumps_with_indent_2(value):
    """The manifest is written without importing json (re, enum: ~4 ms of a small run): byte
    for byte what json.dumps(indent=2) writes, surrogates, NaN and non-str keys included."""
    import json
    from fluidctl.sharding.manifest import to_json
    assert to_json(value) == json.dumps(value, indent=2)
