"""Stacks parsed from recorded text, grouped by identical stack and summarised; py-spy's absence
named; the progress counter. Stacks of live processes are tests/e2e/test_stacks_live.py."""
import os
from pathlib import Path

import pytest

from fluidctl.diagnostics import progress, stacks
from fluidctl.paths import DiagDir


@pytest.fixture
def diag():
    d = DiagDir.create()
    yield d
    d.remove()


def test_pyspy_missing_or_off_is_one_clear_line(monkeypatch):
    monkeypatch.delenv("FLUIDCTL_PYSPY", raising=False)
    monkeypatch.setattr(stacks, "pyspy_path", lambda: None)       # as on a machine without it
    with pytest.raises(stacks.DumpUnavailable) as info:
        stacks.pyspy_dump(os.getpid())
    assert str(info.value) == ("py-spy is not installed (pip install 'fluidctl[debug]' or pip "
                               "install py-spy); using faulthandler instead")
    monkeypatch.setenv("FLUIDCTL_PYSPY", "")
    monkeypatch.setattr(stacks, "pyspy_path", lambda: None)
    with pytest.raises(stacks.DumpUnavailable, match=r"py-spy is off \(FLUIDCTL_PYSPY is empty\)"):
        stacks.pyspy_dump(os.getpid())


def test_faulthandler_needs_the_runtime(tmp_path, diag):
    with pytest.raises(stacks.DumpUnavailable, match="did not call fluidctl.runtime.init"):
        stacks.faulthandler_dump(os.getpid(), diag.stack(7))


PYSPY_TEXT = """\
Process 4242: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    _wait (fluidctl/runtime/collective/shm.py:120)
    allreduce (fluidctl/runtime/collective/shm.py:200)
    allreduce (fluidctl/runtime/__init__.py:59)
    step (/job/train.py:88)
    <module> (/job/train.py:120)
Thread 4250 (idle): "fluidctl-sender"
    wait (threading.py:320)
"""
FH_TEXT = """\
Thread 0x00007f0000000700 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000100 (most recent call first):
  File "/job/data.py", line 40 in load
  File "/job/train.py", line 84 in step
  File "/job/train.py", line 120 in <module>
"""


def test_parse_and_describe_recorded_text():
    spy = stacks.main_stack(stacks.parse_pyspy(PYSPY_TEXT))
    assert [f.func for f in spy] == ["_wait", "allreduce", "allreduce", "step", "<module>"]
    assert stacks.describe(spy) == "wait in allreduce at train.py:88"
    fh = stacks.parse_faulthandler(FH_TEXT)
    assert [t.main for t in fh] == [False, True]
    assert stacks.describe(stacks.main_stack(fh)) == "in load at data.py:40"
    # a rank sampled one line further inside the spin loop is still "the same stack"
    other = [stacks.Frame("_wait", "fluidctl/runtime/collective/shm.py", 125)] + spy[1:]
    lines = stacks.summary({0: spy, 1: stacks.main_stack(fh), 2: other, 3: None},
                           {3: "py-spy: pid 9 exited"})
    assert lines == ["ranks 0,2 wait in allreduce at train.py:88",
                     "rank 1 is in load at data.py:40",
                     "rank 3: no stack (py-spy: pid 9 exited)"]


def test_progress_counter_shared_with_the_launcher(diag):
    reporter = progress.Reporter(diag, 5)
    try:
        assert progress.read_all(diag) == {5: 0}
        for _ in range(3):
            reporter.bump()
        assert progress.read_all(diag) == {5: 3}
    finally:
        reporter.close()
    assert progress.read_all(DiagDir(Path("/nonexistent"))) == {}


