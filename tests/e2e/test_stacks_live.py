"""Stacks of live processes: py-spy and the faulthandler signal, grouped; ptrace denied named with
its fix; the diagnostics modules import nothing above the ground floor (fresh interpreter)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fluidctl.diagnostics import stacks
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


def test_diagnostics_modules_are_ground_floor():
    """progress (imported by every rank), triage and stacks (imported by node agents) import
    nothing of the launcher, nor the CLI's heavy libraries."""
    from importguard import BLOCKED, run_blocked
    result = run_blocked(["fluidctl.diagnostics.progress", "fluidctl.diagnostics.triage", "fluidctl.diagnostics.stacks"],
                         BLOCKED + ["numpy"])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
