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


def test_launch_path_does_not_import_importlib_metadata_yet_paramiko_has_its_version():
    """paramiko's __init__ asks importlib.metadata for its version (10 ms of imports): the
    launch path answers from the distribution's METADATA, and the real module is whole after."""
    code = ("import sys, fluidctl.remote.sshconfig, fluidctl.remote.ssh; "
            "print('importlib.metadata' in sys.modules); "
            "from fluidctl.remote.sshlib import paramiko; print(paramiko.__version__); "
            "import importlib.metadata as m; print(m.version('paramiko')); "
            "print(callable(m.distributions))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "False"
    assert out[1] == out[2] and out[1][0].isdigit()
    assert out[3] == "True"


def test_the_stand_in_answers_as_importlib_metadata_does():
    import importlib.metadata
    from fluidctl.remote.sshlib import _VersionOnly
    shim = _VersionOnly()
    for name in ("paramiko", "click", "msgpack", "python-hostlist"):
        assert shim.version(name) == importlib.metadata.version(name), name
    try:
        shim.version("no-such-distribution-here")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        raise AssertionError("a missing distribution must raise as importlib.metadata does")
    assert shim.distributions is importlib.metadata.distributions
