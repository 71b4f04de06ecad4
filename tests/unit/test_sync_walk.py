"""What ``cluster sync`` lists: ``fluidctl.remote.sftp.walk`` against a plain reference walk,
and its quick exclusion tests against fnmatch's own matching."""
from __future__ import annotations

import errno
import fnmatch
import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from fluidctl.remote import sftp as sync


def reference_walk(source, excludes):
    """The rule, spelled out slowly: every regular file under ``source`` and every symlink whose
    target stays inside it (relative, never above the top: rsync's --safe-links) as a symlink
    (lstat), directories in name order, symlinks never followed, FIFOs left out, a file or
    directory skipped when a pattern matches its relative path or its name."""
    regex = re.compile("|".join(fnmatch.translate(p) for p in excludes)) if excludes else None

    def skip(rel, name):
        return bool(regex and (regex.match(rel) or regex.match(name)))
    out = []

    def visit(path, rel_dir):
        for name in sorted(os.listdir(path)):
            rel = f"{rel_dir}{name}"
            full = os.path.join(path, name)
            if skip(rel, name):
                continue
            if os.path.islink(full):
                target = os.readlink(full)
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if not os.path.isabs(target) and inside != ".." and not inside.startswith("../"):
                    out.append((rel, full, os.lstat(full)))
            elif os.path.isdir(full):
                visit(full, rel + "/")
            elif os.path.isfile(full):
                out.append((rel, full, os.stat(full)))
    visit(source, "")
    return out


def listing(entries):
    return [(rel, path, st.st_size, st.st_mtime_ns, st.st_mode) for rel, path, st in entries]


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    for rel, data in [("train.py", b"x" * 10), ("pkg/__init__.py", b""), ("pkg/a.pyc", b"c"),
                      ("pkg/__pycache__/a.cpython-311.pyc", b"c"), (".git/HEAD", b"ref"),
                      ("data/raw/part-0", b"0" * 100), ("data/raw/part-1.ckpt", b"1"),
                      ("with space/new\nline.txt", b"n"), ("zz/abc3/def", b"d"),
                      ("A/b", b"upper before lower")]:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    os.mkdir(os.fsencode(src) + b"/caf\xe9")                   # not UTF-8
    with open(os.fsencode(src) + b"/caf\xe9/menu", "wb") as f:
        f.write(b"m")
    os.symlink(src / "data", src / "data-link")                 # a symlinked directory
    os.symlink(src / "train.py", src / "train-link.py")         # a symlinked file
    os.symlink(src / "missing", src / "dangling")
    os.symlink("data", src / "rel-data-link")                  # relative, inside: kept
    os.symlink("../train.py", src / "pkg" / "up-link.py")
    os.symlink("missing", src / "rel-dangling")
    os.symlink("../outside", src / "out-link")                  # climbs out: skipped
    os.symlink("pkg/../../outside", src / "out-link2")
    os.mkfifo(src / "fifo")
    return src


@pytest.mark.parametrize("excludes", [
    (), sync.DEFAULT_EXCLUDES, (*sync.DEFAULT_EXCLUDES, "*.ckpt", "data"),
    ("raw", "*3", "with space/*"), ("[ab]bc3", "?ata", "d*/raw/part-?"), ("*",)])
def test_walk_lists_what_the_plain_rule_lists(tree, excludes):
    assert listing(sync.walk(tree, excludes)) == listing(reference_walk(str(tree), excludes))


def test_walk_of_a_single_file(tree):
    [(rel, path, st)] = sync.walk(tree / "train.py", sync.DEFAULT_EXCLUDES)
    assert (rel, path, st.st_size) == ("train.py", str(tree / "train.py"), 10)


def test_a_directory_that_cannot_be_opened_is_named_by_its_whole_path(tree, monkeypatch):
    """As root nothing is unreadable, so os.open refuses one directory as it would refuse an
    unprivileged user (EACCES): the error names the directory's path, not just its name."""
    real_open = os.open

    def refusing(path, flags, mode=0o777, *, dir_fd=None):
        if path == "raw" and dir_fd is not None:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, mode, dir_fd=dir_fd)
    monkeypatch.setattr(sync.os, "open", refusing)
    with pytest.raises(PermissionError) as refused:
        sync.walk(tree, ())
    assert refused.value.filename == str(tree / "data" / "raw")


PATTERN = st.text(alphabet="ab3.*?[]!/", min_size=0, max_size=6)
REL = st.lists(st.text(alphabet="ab3.c", min_size=1, max_size=5), min_size=1, max_size=3)


@settings(max_examples=400, deadline=None)
@given(patterns=st.lists(PATTERN, max_size=4), parts=REL)
def test_quick_name_tests_agree_with_fnmatch_on_path_and_name(patterns, parts):
    """A literal name is tested by set membership and ``*SUFFIX`` by endswith, on the name
    alone: the same answer as fnmatch's regex on the relative path or on the name."""
    rel, name = "/".join(parts), parts[-1]
    try:
        full = sync._matcher(patterns)
    except re.error:            # fnmatch.translate never yields one; keep the test honest
        pytest.fail(f"untranslatable patterns {patterns!r}")
    expected = bool(full(rel) or full(name))
    names, suffixes, match = sync._name_tests(patterns)
    quick = (name in names or bool(suffixes and name.endswith(suffixes))
             or bool(match and (match(rel) or match(name))))
    assert quick == expected, (patterns, rel)
