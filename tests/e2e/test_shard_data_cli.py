"""fluidctl shard-data as a user runs it: --verify, --force, the table and the progress bar, bad
input, unwritable and full disks, copies across file systems and the kernel's copy, and an
interrupted run that leaves nothing."""
import gzip
import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluidctl import sharding
from fluidctl.errors import UsageError

from launchutil import default_sigint, read_terminal
from shardutil import (check_manifest_matches_files, listing, run, shard_files, text_input,
                       write_lines)


@pytest.fixture
def text(tmp_path):
    return text_input(tmp_path)


# --- helpers ---------------------------------------------------------------------------------
def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fluidctl", "shard-data", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def assert_one_line_error(result, *words):
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


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
    # no progress; only the warning that the shards' record counts differ
    assert result.stderr.startswith("warning: the shards hold 496 to 504 records")
    assert len(result.stderr.splitlines()) == 1
    quiet = cli(text, "--trainers", "2", "-o", tmp_path / "q", "-q", "--equalize", "truncate")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_progress_bar_on_a_terminal(text, tmp_path):
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="120")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "shard-data", str(text), "-n",
                             "2", "-o", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                            stderr=slave, env=env)
    os.close(slave)
    seen = read_terminal(master)
    assert proc.wait(timeout=60) == 0
    assert b"writing shards" in seen and b"records" in seen


# --- bad input: one line, exit 2, nothing left behind ----------------------------------------
@pytest.mark.parametrize("case", [
    "missing", "empty_dir", "trainers_0", "more_trainers_than_records", "binary", "csv_header",
    "out_inside_input", "input_inside_out", "bad_json", "empty_file", "suffix_too_short",
    "bad_gzip", "twice", "shards_and_trainers", "shards_equalize", "shards_to_hosts",
    "more_shards_than_records",
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
        "shards_and_trainers": ([three, "--shards", "2", "-n", "2"], ["not both"]),
        "shards_equalize": ([three, "--shards", "2", "--equalize", "pad"],
                            ["--equalize pad with --shards", "drop --equalize"]),
        "shards_to_hosts": ([three, "--shards", "2", "--to-hosts", work / "hosts"],
                            ["read by every trainer", "cluster sync"]),
        "more_shards_than_records": ([three, "--shards", "5"],
                                     ["5 shards but only 3 record", "--shards 3"]),
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
