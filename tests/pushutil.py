"""A workspace to push (files, an executable, a subdirectory, a large file, excluded ones), and
the push's file list of it: shared by the push tests on real sshd nodes and with a local command."""
import os

from fluidctl.remote import push
from fluidctl.remote.sftp import DEFAULT_EXCLUDES, walk


def files_of(src, *extra):
    return push.scan(walk(src, (*DEFAULT_EXCLUDES, *extra)))


def make_workspace(tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print('v1')\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o750)
    (src / "pkg" / "sub" / "lib.py").write_text("X = 1\n")
    (src / "weights.bin").write_bytes(os.urandom(3 << 20))          # through sendfile
    (src / "empty.txt").write_bytes(b"")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"skip")
    (src / "big.ckpt").write_bytes(b"0" * 10)
    return src
