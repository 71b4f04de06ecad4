"""paramiko is loaded without invoke (start-up time), yet `Match exec` in ssh configs works."""
import subprocess
import sys


def test_launch_path_does_not_import_invoke():
    code = ("import sys, fluidctl.remote.sshconfig, fluidctl.remote.ssh; "
            "print('invoke' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_match_exec_still_works(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text('Match exec "true"\n    HostName 10.9.8.7\n    Port 2222\n')
    code = ("from fluidctl.remote.sshconfig import load_config; "
            f"c = load_config({str(cfg)!r}).lookup('anyhost'); print(c['hostname'], c['port'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["10.9.8.7", "2222"]
