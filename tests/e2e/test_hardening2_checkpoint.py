"""Issue 27 #9 (hardening): a pserver checkpoint that fails (a full disk) removes its
temporary files, and the failure reaches the job: a warning on the launcher's console and in
launch.log, exit code 1 when the final checkpoint could not be saved. The disk is a real small
tmpfs mounted for the test (root), unmounted after it."""
import os
import re
import subprocess

import numpy as np
import pytest

from fluidctl.runtime import optim
from fluidctl.runtime.pserver import checkpoint
from fluidctl.runtime.pserver.shard import ShardState

from launchutil import TEMPLATES, fluidctl


@pytest.fixture
def small_disk(tmp_path, request):
    """A tmpfs of ``request.param`` bytes (default 8 KiB) at tmp_path/ck."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    size = getattr(request, "param", 8192)
    where = tmp_path / "ck"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        if os.path.ismount(where):
            subprocess.run(["umount", "-l", str(where)], check=True)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def shard(rows: int) -> ShardState:
    s = ShardState(trainers=1, sync=False, pserver_id=0)
    s.register(0, sync=False, opt_config=optim.SGD(0.1).config(), fingerprint=1,
               dense=[("w", np.dtype("<f4"), (rows, 16))],
               init_values=[np.ones((rows, 16), np.float32)], sparse=[], timeout=1)
    return s


@pytest.mark.parametrize("small_disk", [64 * 1024], indirect=True)
def test_27_9_a_failed_save_leaves_no_temporary_and_the_last_checkpoint(small_disk):
    directory = small_disk / "pserver.0"
    small = shard(rows=100)                       # 6.4 kB: fits
    small.step = 10
    with small.cond:
        checkpoint.save(small, directory)
    free = free_bytes(small_disk)
    big = shard(rows=4000)                        # 256 kB: the disk is too small
    big.step = 20
    with big.cond, pytest.raises(OSError) as failed:
        checkpoint.save(big, directory)
    assert "No space left" in str(failed.value)
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json", "shard-0000000010.bin"]       # no .shard-*.bin.tmp left
    assert free_bytes(small_disk) == free
    back = ShardState(trainers=1, sync=False, pserver_id=0)
    assert checkpoint.load(back, directory)["step"] == 10


def test_27_9_checkpoint_failures_reach_the_job(small_disk, tmp_path):
    free = free_bytes(small_disk)
    res = fluidctl("train", "--mode", "pserver", "--pservers", 1, "--nproc", 2,
                   "--checkpoint-dir", small_disk, "--checkpoint-every", 5,
                   TEMPLATES / "train_pserver.py", "--steps", 20, cwd=tmp_path, timeout=180)
    server_log = (tmp_path / "mylog" / "serverlog.0").read_text()
    assert "No space left on device" in server_log
    # the job fails: its final checkpoint is not on disk
    assert res.returncode == 1, res.stdout + res.stderr
    warning = re.search(r"fluidctl: warning: pserver 0: (\d+) checkpoint\(s\) failed in "
                        rf"{re.escape(str(small_disk))}/pserver.0 \(first at step 5: .*No "
                        r"space left on device\)", res.stderr)
    assert warning and int(warning.group(1)) >= 2, res.stderr
    assert "fluidctl: error: pserver 0 could not save its final checkpoint" in res.stderr
    launch = (tmp_path / "mylog" / "launch.log").read_text()
    assert "checkpoint(s) failed" in launch and "could not save its final checkpoint" in launch
    # nothing partial keeps the disk full
    assert sorted(p.name for p in (small_disk / "pserver.0").iterdir()) == ["lock"]
    assert free_bytes(small_disk) == free


def test_27_9_checkpoints_that_succeed_say_nothing(tmp_path):
    res = fluidctl("train", "--mode", "pserver", "--pservers", 1, "--nproc", 2,
                   "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", 5,
                   TEMPLATES / "train_pserver.py", "--steps", 10, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "checkpoint" not in res.stderr
