"""Files fluidctl reads from its state directory (the user secret, job records, pserver
records) are opened with O_NONBLOCK and must be regular files: a FIFO there would block
open() for ever, in `train`, `job status` and every plain-srun rank (OpenSSH refuses
non-regular key files the same way). Each case runs in a child with a deadline."""
import os
import subprocess
import sys

import pytest

from fluidctl import paths


def _run(code, state, timeout=30):
    env = dict(os.environ, FLUIDCTL_STATE_DIR=str(state))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_the_user_secret_must_be_a_regular_file(tmp_path, kind):
    secret = tmp_path / "secret"
    os.mkfifo(secret, 0o600) if kind == "fifo" else secret.mkdir(mode=0o700)
    res = _run("from fluidctl.runtime import usersecret\n"
               "try:\n"
               "    usersecret.user_secret()\n"
               "except usersecret.SecretUnavailable as exc:\n"
               "    print(exc.args[0])\n", tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{secret} is not a regular file" in res.stdout, res.stdout


def test_a_job_record_that_is_a_fifo_is_one_line_not_a_hang(tmp_path):
    (tmp_path / "jobs").mkdir()
    os.mkfifo(tmp_path / "jobs" / "slurm-42.json")
    env = dict(os.environ, FLUIDCTL_STATE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "fluidctl", "job", "status", "42"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "is not a regular file" in res.stderr


def test_a_pserver_record_that_is_a_fifo_is_skipped(tmp_path):
    os.mkfifo(tmp_path / "pserver-7000.json")
    res = _run("from fluidctl.pserverctl import records\nprint(records.records())", tmp_path)
    assert res.returncode == 0 and res.stdout == "[]\n", res.stderr


def test_read_state_file_limits_the_size(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(paths.StateFileError, match="more than 10 bytes"):
        paths.read_state_file(big, limit=10)
    assert paths.read_state_file(big) == b"x" * 100
    with pytest.raises(FileNotFoundError):
        paths.read_state_file(tmp_path / "absent")


@pytest.mark.parametrize("text", ['[1, 2]', '"x"', '{"job_id": 42}',
                                  '{"job_id": "42", "name": "x", "script": "s", "log_dir": "/l",'
                                  ' "workdir": "w", "nodes": "two", "ntasks_per_node": 1}'])
def test_a_job_record_of_the_wrong_shape_is_one_line(tmp_path, text):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "slurm-42.json").write_text(text)
    env = dict(os.environ, FLUIDCTL_STATE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "fluidctl", "job", "status", "42"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "slurm-42.json" in res.stderr and "Traceback" not in res.stderr
