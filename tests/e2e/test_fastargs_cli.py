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
    assert lines[0].startswith("error: 1 of 1 node(s) failed to sync: deadnode:"), r.stderr
    assert "Traceback" not in r.stderr
