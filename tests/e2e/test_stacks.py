"""Stacks of real running processes (py-spy from outside; the runtime's faulthandler signal
from inside), parsed, grouped by identical stack and summarised; the progress counter."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fluidctl.diagnostics import progress, stacks
from fluidctl.paths import DiagDir

# a "rank": registers progress/faulthandler the way fluidctl.runtime.init() does, then waits
RANK = textwrap.dedent("""
    import os, sys, threading, time
    from fluidctl.diagnostics import progress
    progress.start(int(sys.argv[1]))
    def allreduce():                     # stands in for a collective that never completes
        threading.Event().wait()
    def load():
        while True:
            time.sleep(0.05)
    print("ready", flush=True)
    allreduce() if sys.argv[2] == "allreduce" else load()
""")


def start_rank(tmp_path, rank, body, diag):
    script = tmp_path / "train.py"
    script.write_text(RANK)
    env = dict(os.environ, FLUIDCTL_DIAG_DIR=str(diag.root))
    proc = subprocess.Popen([sys.executable, str(script), str(rank), body], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, script


@pytest.fixture
def diag():
    d = DiagDir.create()
    yield d
    d.remove()


def stop(*procs):
    for p in procs:
        p.kill()
        p.wait()


def test_pyspy_and_faulthandler_stacks_grouped(tmp_path, diag):
    if not stacks.pyspy_path():
        pytest.skip("py-spy not installed (pip install 'fluidctl[debug]')")
    procs = {0: start_rank(tmp_path, 0, "allreduce", diag),
             1: start_rank(tmp_path, 1, "load", diag),
             2: start_rank(tmp_path, 2, "allreduce", diag)}
    try:
        by_spy = {r: stacks.main_stack(stacks.parse_pyspy(stacks.pyspy_dump(p.pid)))
                  for r, (p, _) in procs.items()}
        by_fh = {r: stacks.main_stack(stacks.parse_faulthandler(
                     stacks.faulthandler_dump(p.pid, diag.stack(r))))
                 for r, (p, _) in procs.items()}
    finally:
        stop(*(p for p, _ in procs.values()))
    for found in (by_spy, by_fh):
        lines = stacks.summary(found)
        assert lines == ["ranks 0,2 wait in wait at train.py:6",
                         "rank 1 is in load at train.py:9"], lines
        groups = stacks.group_ranks(found)
        assert [g[0] for g in groups] == [[0, 2], [1]]


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


def test_pyspy_denied_names_ptrace_and_the_fix(tmp_path):
    # a real py-spy, denied by the kernel: it may not attach to a process of another user
    if not stacks.pyspy_path() or os.geteuid() != 0:
        pytest.skip("needs py-spy and root (to run py-spy as another user)")
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    import shutil
    import tempfile
    where = Path(tempfile.mkdtemp(prefix="fluidctl-pyspy-"))     # readable by nobody
    where.chmod(0o755)
    exe = where / "py-spy"
    shutil.copy(os.path.realpath(shutil.which("py-spy", path=str(
        Path(stacks.pyspy_path()).resolve().parent)) or stacks.pyspy_path()), exe)
    real = subprocess.run([str(exe), "--version"], capture_output=True)
    if real.returncode != 0:
        shutil.rmtree(where)
        pytest.skip("py-spy on PATH is a shim, not the binary")
    wrapper = where / "py-spy-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid={nobody.pw_uid} "
                       f"--regid={nobody.pw_gid} --clear-groups {exe} \"$@\"\n")
    wrapper.chmod(0o755)
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(stacks.DumpUnavailable) as info:
            stacks.pyspy_dump(target.pid, exe=str(wrapper))
        assert "ptrace is not allowed" in str(info.value), str(info.value)
        assert "faulthandler instead" in str(info.value)
    finally:
        stop(target)
        shutil.rmtree(where)


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


def test_diagnostics_modules_are_ground_floor():
    """progress (imported by every rank), triage and stacks (imported by node agents) import
    nothing of the launcher, nor the CLI's heavy libraries."""
    from importguard import BLOCKED, run_blocked
    result = run_blocked(["fluidctl.diagnostics.progress", "fluidctl.diagnostics.triage", "fluidctl.diagnostics.stacks"],
                         BLOCKED + ["numpy"])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
