"""Issue 27, hardening: what used to end in a traceback ends in one line (or the rank's code)."""
import os
import subprocess
from pathlib import Path

import pytest

from launchutil import fluidctl


def one_line(proc, code, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled up; unmounted at the end."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_27_11_full_log_dir_at_start_is_one_line(tmp_path, full_disk):
    (tmp_path / "t.py").write_text("print('ran')\n")
    proc = fluidctl("train", "--log-dir", full_disk / "logs", "t.py", cwd=tmp_path)
    one_line(proc, 2, "log dir", "No space left on device", "--log-dir")
    assert "ran" not in proc.stdout
    assert not (full_disk / "logs").exists()          # nothing half-made


def test_27_11_log_dir_removed_mid_run_then_the_rank_s_code(tmp_path):
    (tmp_path / "t.py").write_text(
        "import os, shutil, sys, time\n"
        "time.sleep(0.5)\n"
        "if os.environ['PADDLE_TRAINER_ID'] == '0':\n"
        "    shutil.rmtree(sys.argv[1])\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n")
    logs = tmp_path / "logs"
    proc = fluidctl("train", "--nproc", 2, "--log-dir", logs, "t.py", logs, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "trainer 0 failed" in proc.stderr and "exit code 3" in proc.stderr, proc.stderr
    assert f"warning: cannot write {logs / 'failure.json'}" in proc.stderr


def test_27_11_negative_seed_is_one_line(tmp_path):
    (tmp_path / "in.txt").write_text("a\nb\nc\n")
    proc = fluidctl("shard-data", "in.txt", "-n", 2, "-o", "out", "--shuffle", "--seed", -5,
                    cwd=tmp_path)
    one_line(proc, 2, "--seed -5")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("env, name", [
    ({"OMPI_COMM_WORLD_SIZE": "abc"}, "OMPI_COMM_WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_SIZE": "abc", "OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK"),
])
def test_27_11_bad_ompi_variables_are_one_line(tmp_path, env, name):
    (tmp_path / "t.py").write_text("print('ran')\n")
    proc = fluidctl("worker", "t.py", cwd=tmp_path, env=env)
    one_line(proc, 2, name)
    assert "ran" not in proc.stdout
