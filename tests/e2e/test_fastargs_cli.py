"""cluster sync's plain form runs without importing click, checked in a real fluidctl process."""
import subprocess
import sys


def test_cluster_sync_runs_without_click(tmp_path):
    """A plain ``cluster sync`` goes from argv to its ssh without importing click (15-30 ms of
    the start-up before the first handshake) or subprocess (~4 ms: ssh is started with
    posix_spawn); its errors keep the one-line contract."""
    config = tmp_path / "ssh_config"
    config.write_text("Host deadnode\n    HostName 127.0.0.1\n    Port 1\n")
    (tmp_path / "src").mkdir()
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('click' in sys.modules or 'subprocess' in sys.modules,"
            " file=sys.stderr))\n"
            "from fluidctl.cli import main\n"
            f"main(['cluster', 'sync', '--hosts', 'deadnode', '--ssh-config', {str(config)!r},"
            f" '--timeout', '5', {str(tmp_path / 'src')!r}])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert lines[-1] == "False", r.stderr                 # neither was imported
    assert lines[-2].startswith("error: node deadnode failed to sync: "), r.stderr
    assert "Traceback" not in r.stderr


def test_a_plain_train_runs_without_click(tmp_path):
    """``fluidctl train --nproc 2 SCRIPT`` plans, starts and supervises its ranks without
    importing click; a mistake click would word goes to click, one line, exit 2."""
    script = tmp_path / "ok.py"
    script.write_text("print('rank ran')\n")
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('click' in sys.modules, file=sys.stderr))\n"
            "from fluidctl.cli import main\n"
            "main(sys.argv[1:])\n")
    argv = [sys.executable, "-c", code, "train", "--nproc", "2", "--log-dir",
            str(tmp_path / "log"), str(script)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rank ran" in r.stdout and r.stderr.strip().splitlines()[-1] == "False", r.stderr
    r = subprocess.run(argv[:4] + ["--nproc", "0", str(script)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: Invalid value for --nproc"), r.stderr
    assert r.stderr.strip().splitlines()[-1] == "True", r.stderr
