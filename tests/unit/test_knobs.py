"""The runtime's numeric environment knobs (FLUIDCTL_HANDSHAKE_TIMEOUT, FLUIDCTL_MAX_FRAME,
FLUIDCTL_DROP_LOG_INTERVAL): a bad value set for a command is one line and exit 2 before
anything starts; read inside a rank it is ignored with one line on stderr."""
import subprocess
import sys

import pytest

from fluidctl import cli, envs
from fluidctl.errors import UsageError

BAD = ["nan", "inf", "-inf", "-1", "0", "ten", "1e400"]


@pytest.mark.parametrize("value", BAD)
def test_a_bad_timeout_is_a_usage_error(value):
    with pytest.raises(UsageError) as err:
        envs.check_knobs({envs.HANDSHAKE_TIMEOUT: value})
    assert err.value.one_line() == (
        f"error: FLUIDCTL_HANDSHAKE_TIMEOUT={value!r} is not a number of seconds above 0 "
        "(unset FLUIDCTL_HANDSHAKE_TIMEOUT or set one, e.g. FLUIDCTL_HANDSHAKE_TIMEOUT=10)")


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "1.5", "4GiB"])
def test_a_bad_frame_limit_is_a_usage_error(value):
    with pytest.raises(UsageError, match=r"FLUIDCTL_MAX_FRAME=.* is not a whole number of bytes"):
        envs.check_knobs({envs.MAX_FRAME: value})


def test_good_and_unset_values_pass():
    envs.check_knobs({envs.HANDSHAKE_TIMEOUT: "2.5", envs.MAX_FRAME: "1048576",
                      envs.DROP_LOG_INTERVAL: ""})
    assert envs.knob(envs.HANDSHAKE_TIMEOUT, {envs.HANDSHAKE_TIMEOUT: "2.5"}) == 2.5
    assert envs.knob(envs.MAX_FRAME, {}) == 4 << 30


def test_inside_a_rank_a_bad_value_is_ignored_with_one_line(capsys):
    assert envs.knob(envs.HANDSHAKE_TIMEOUT, {envs.HANDSHAKE_TIMEOUT: "nan"}) == 10.0
    assert capsys.readouterr().err == ("fluidctl: ignoring FLUIDCTL_HANDSHAKE_TIMEOUT='nan' "
                                       "(not a number of seconds above 0); using 10\n")


def test_the_wire_module_imports_with_bad_values_and_keeps_the_defaults():
    code = ("from fluidctl.runtime import wire; "
            "print(wire.HANDSHAKE_TIMEOUT, wire.MAX_PAYLOAD, wire.DROP_LOG_INTERVAL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={envs.HANDSHAKE_TIMEOUT: "nan", envs.MAX_FRAME: "inf",
                                          envs.DROP_LOG_INTERVAL: "-1", "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10.0", str(4 << 30), "10.0"]
    assert out.stderr.count("fluidctl: ignoring") == 3


@pytest.mark.parametrize("command", [["train", "--nproc", "1", "x.py"],
                                     ["pserver", "start", "--port", "1", "--trainers", "1"]])
def test_commands_refuse_them_before_starting_anything(capsys, monkeypatch, tmp_path, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(envs.HANDSHAKE_TIMEOUT, "nan")
    with pytest.raises(SystemExit) as exit_:
        cli.main(command)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert err.startswith("error: FLUIDCTL_HANDSHAKE_TIMEOUT='nan' is not a number")
    assert err.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["nan", "inf", "abc", "-1", "0"])
def test_a_bad_fluidctl_timeout_is_refused_in_one_line_by_train_and_in_env(capsys, monkeypatch,
                                                                            tmp_path, value):
    """FLUIDCTL_TIMEOUT, from the launcher's environment or --env: one line, exit 2, before
    anything starts (each rank used to die with a traceback)."""
    script = tmp_path / "x.py"
    script.write_text("")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    for given in ("environ", "--env"):
        if given == "environ":
            monkeypatch.setenv(envs.TIMEOUT, value)
            argv = ["train", "--nproc", "1", str(script)]
        else:
            monkeypatch.delenv(envs.TIMEOUT)
            argv = ["train", "--nproc", "1", "--env", f"{envs.TIMEOUT}={value}", str(script)]
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        out, err = capsys.readouterr()
        assert exit_.value.code == 2 and out == "", given
        assert err.startswith(f"error: FLUIDCTL_TIMEOUT={value!r} is not a number of seconds "
                              "above 0"), (given, err)
        assert err.count("\n") == 1 and not list(run.iterdir())


@pytest.mark.parametrize("value", ["nan", "inf", "abc", "-1", "0"])
def test_inside_a_rank_a_bad_fluidctl_timeout_is_the_default_with_one_line(capsys, value):
    environ = {envs.TIMEOUT: value}
    assert envs.read(environ).timeout == envs.DEFAULT_TIMEOUT
    assert capsys.readouterr().err.startswith(f"fluidctl: ignoring FLUIDCTL_TIMEOUT={value!r}")


def test_the_heartbeat_timeout_sets_both_ends_beats(monkeypatch):
    """FLUIDCTL_HEARTBEAT_TIMEOUT: an elastic job's launcher beats every sixth of it (and hands
    that period to its agents, which wait the same six beats); a bad value is refused."""
    from fluidctl.agentproto import BEAT_MISSES
    from fluidctl.backends.ssh.launcher import SSHLauncher
    launcher = SSHLauncher.__new__(SSHLauncher)
    launcher.members = None
    assert launcher.beat == 0.0                       # not elastic: no beats
    launcher.members = object()
    monkeypatch.delenv(envs.HEARTBEAT_TIMEOUT, raising=False)
    assert launcher.beat * BEAT_MISSES == pytest.approx(3.0)
    monkeypatch.setenv(envs.HEARTBEAT_TIMEOUT, "30")
    assert launcher.beat == pytest.approx(5.0)
    with pytest.raises(UsageError, match="FLUIDCTL_HEARTBEAT_TIMEOUT='0' is not a number of "
                                         "seconds above 0"):
        envs.check_knobs({envs.HEARTBEAT_TIMEOUT: "0"})
