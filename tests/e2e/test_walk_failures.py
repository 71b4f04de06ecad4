"""What a new user met on a third walk (issue 39), on this machine: the failure and hang
sentences of unmodified torch scripts and of a script that never calls a collective."""
import importlib.util
import json

import pytest

from launchutil import fluidctl

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed")

RAISES_ON_RANK_1 = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("bad batch shape")
time.sleep(600)             # rank 0 waits to be stopped: rank 1 is the only failure
"""


@needs_torch
def test_torch_ddp_exception_behind_rank_prefixes_is_explained(tmp_path):
    """torch prints an uncaught exception as ``[rank1]: Traceback ...``: the prefix must not
    hide it (the report and failure.json name the exception and its line)."""
    (tmp_path / "ddp_raises.py").write_text(RAISES_ON_RANK_1)
    res = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "logs", "ddp_raises.py",
                   cwd=tmp_path, timeout=300)
    assert res.returncode == 1, res.stderr
    assert "no traceback" not in res.stderr, res.stderr
    assert "why: ValueError: bad batch shape (at ddp_raises.py:5)" in res.stderr, res.stderr
    first = json.loads((tmp_path / "logs" / "failure.json").read_text())["first_failure"]
    assert first["label"] == "trainer 1"
    assert first["explanation"] == "ValueError: bad batch shape (at ddp_raises.py:5)"


def test_pythons_cant_open_file_line_is_quoted(tmp_path):
    """A rank whose python cannot open its script (here: it re-executes python on a file that
    is not there, as a node without the script would) is explained by Python's own line."""
    (tmp_path / "reexec.py").write_text(
        "import os, sys\nos.execv(sys.executable, [sys.executable, 'gone.py'])\n")
    res = fluidctl("train", "--nproc", 1, "--log-dir", tmp_path / "logs", "reexec.py",
                   cwd=tmp_path, timeout=120)
    err = " ".join(res.stderr.split())          # as one line, however the console wrapped it
    assert res.returncode == 2, res.stderr
    assert "no traceback" not in err, res.stderr
    assert "why: python can't open file " in err and "gone.py': [Errno 2] No such file or " \
        "directory (copy the script there, or pass --remote-dir with the directory that " \
        "holds it)" in err, res.stderr


NO_COLLECTIVE = """\
import time


def wait_for_peer():
    while True:
        time.sleep(0.5)


wait_for_peer()
"""


def test_a_hang_without_any_collective_is_every_rank_idle_not_desync(tmp_path):
    from launchutil import start_fluidctl
    (tmp_path / "plainhang.py").write_text(NO_COLLECTIVE)
    proc = start_fluidctl("train", "--nproc", 2, "--hang-timeout", 3, "--log-dir",
                          tmp_path / "logs", "plainhang.py", cwd=tmp_path)
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 124, err
    assert "desync" not in err and "never reached" not in err, err
    first = err.splitlines()[0]
    assert first.startswith("fluidctl: the job hung: idle: every rank idles in wait_for_peer "
                            "(plainhang.py:6"), err
    hang = json.loads((tmp_path / "logs" / "failure.json").read_text())["hang"]
    assert hang["class"] == "idle" and hang["ranks"] == [0, 1]


@needs_torch
def test_torch_hang_without_pyspy_has_a_verdict_from_the_flight_recorder_and_one_hint(tmp_path):
    """No py-spy and no fluidctl.runtime: no stacks. torch's own records still say what
    happened, in the first line; the advice to install py-spy comes once, not per rank."""
    import re
    from launchutil import ROOT, start_fluidctl
    from pace import hang_timeout
    proc = start_fluidctl("train", "--nproc", 2, "--hang-timeout", hang_timeout(3), "--log-dir",
                          tmp_path / "logs", ROOT / "tests" / "scripts" / "torch_hang.py",
                          "uneven", cwd=tmp_path, env={"FLUIDCTL_PYSPY": ""})
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 124, err
    first = err.splitlines()[0]
    assert re.match(r"fluidctl: the job hung: desync: collective #\d+ differs between ranks: "
                    r"rank 0 calls broadcast \(\[3\] int\); rank 1 calls barrier", first), err
    assert err.count("py-spy") == 1 and "pip install 'fluidctl[debug]'" in err, err
    assert json.loads((tmp_path / "logs" / "failure.json").read_text())["hang"]["class"] \
        == "desync"
