"""Issue 27, hardening: messages that named the wrong cause."""
import os
import socket

from launchutil import fluidctl
from test_hardening2_errors import full_disk, one_line  # noqa: F401 (a fixture)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pserver_env(tmp_path, state):
    (tmp_path / "tok").write_text("0123456789abcdef0123456789abcdef\n")
    return {"FLUIDCTL_STATE_DIR": str(state)}


def test_27_13_an_unusable_checkpoint_dir_is_named(tmp_path):
    env = pserver_env(tmp_path, tmp_path / "state")
    proc = fluidctl("pserver", "start", "--host", "127.0.0.1", "--port", free_port(),
                    "--token-file", "tok", "--checkpoint-dir", "/proc/nope", cwd=tmp_path,
                    env=env, timeout=60)
    line = proc.stderr.strip()
    one_line(proc, 2, "checkpoint directory /proc/nope", "--checkpoint-dir")
    assert "listen" not in line and "--port" not in line, line


def test_27_13_a_full_state_dir_gets_a_hint_pserver_start_takes(tmp_path, full_disk):
    env = pserver_env(tmp_path, full_disk / "state")
    proc = fluidctl("pserver", "start", "--host", "127.0.0.1", "--port", free_port(),
                    "--token-file", "tok", cwd=tmp_path, env=env, timeout=60)
    one_line(proc, 2, "No space left on device", "FLUIDCTL_STATE_DIR")
    assert "--no-state" not in proc.stderr
    port = free_port()
    daemon = fluidctl("pserver", "start", "--host", "127.0.0.1", "--port", port,
                      "--token-file", "tok", "--daemon", cwd=tmp_path, env=env, timeout=60)
    lines = daemon.stderr.strip().splitlines()
    assert daemon.returncode != 0 and len(lines) == 1, daemon.stderr
    assert "without a word" not in lines[0] and "no space left" in lines[0], lines[0]
    assert "FLUIDCTL_STATE_DIR" in lines[0] and "--no-state" not in lines[0]


def test_27_13_a_huge_suffix_length_is_one_short_line(tmp_path):
    (tmp_path / "in.txt").write_text("a\nb\n")
    proc = fluidctl("shard-data", "in.txt", "-n", 2, "-o", "out", "--suffix-length", 10000,
                    cwd=tmp_path)
    one_line(proc, 2, "--suffix-length 10000")
    assert len(proc.stderr) < 200 and not (tmp_path / "out").exists()


def test_27_13_a_syntax_error_is_named(tmp_path):
    (tmp_path / "syn.py").write_text("x = 1\ndef f(:\n    pass\n")
    proc = fluidctl("train", "--log-dir", tmp_path / "logs", "syn.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "why: SyntaxError: invalid syntax (at syn.py:2)" in proc.stderr, proc.stderr
    assert "no traceback" not in proc.stderr


def test_27_13_a_rank_that_failed_on_its_own_is_not_listed_as_stopped(tmp_path):
    (tmp_path / "t.py").write_text(
        "import os, signal, sys, time\n"
        "if os.environ['PADDLE_TRAINER_ID'] == '0':\n"
        "    time.sleep(0.5)\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(2)\n"
        "sys.exit(4)\n")
    proc = fluidctl("train", "--nproc", 2, "--grace-period", 20, "--log-dir", tmp_path / "l",
                    "t.py", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "trainer 1 on 127.0.0.1: failed: exit code 4" in proc.stderr, proc.stderr
    assert "still running" not in proc.stderr
