"""Issue 27, hardening: numeric options, and what a user's bad input gets (one line, exit 2)."""
import socket
from pathlib import Path

import click
import pytest

from fluidctl import cli
from launchutil import fluidctl


@pytest.fixture
def silent_node(tmp_path):
    """A node that accepts TCP and never says a word, named in an ssh config."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host silent\n  HostName 127.0.0.1\n  Port {server.getsockname()[1]}\n")
    yield config
    server.close()


def one_line_error(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.mark.parametrize("argv, env, flag", [
    (["train", "--hosts", "silent", "--ssh-timeout", "nan", "t.py"], {}, "--ssh-timeout nan"),
    (["train", "--hosts", "silent", "--ssh-timeout", "-1", "t.py"], {}, "--ssh-timeout -1"),
    (["train", "--hang-timeout", "nan", "t.py"], {}, "--hang-timeout nan"),
    (["train", "--hang-timeout", "inf", "t.py"], {}, "--hang-timeout inf"),
    (["train", "t.py"], {"FLUIDCTL_HANG_TIMEOUT": "nan"}, "FLUIDCTL_HANG_TIMEOUT"),
    (["train", "--grace-period", "inf", "t.py"], {}, "--grace-period inf"),
    (["cluster", "check", "--hosts", "silent", "--timeout", "nan"], {}, "--timeout nan"),
    (["cluster", "exec", "--hosts", "silent", "--timeout", "inf", "--", "true"], {},
     "--timeout inf"),
    (["cluster", "sync", "--hosts", "silent", "--timeout", "inf", "."], {}, "--timeout inf"),
    (["dump", "--timeout", "nan"], {}, "--timeout nan"),
    (["pserver", "stop", "--all", "--timeout", "inf"], {}, "--timeout inf"),
])
def test_27_8_nan_timeouts_are_refused(tmp_path, silent_node, argv, env, flag):
    (tmp_path / "t.py").write_text("print('ran')\n")
    if argv[0] == "cluster" or "--hosts" in argv:
        argv = argv[:1 + (argv[0] == "cluster")] + ["--ssh-config", str(silent_node)] + \
            argv[1 + (argv[0] == "cluster"):]
    proc = fluidctl(*argv, cwd=tmp_path, env={"HOME": str(tmp_path), **env}, timeout=60)
    one_line_error(proc, flag)
    assert not (tmp_path / "mylog").exists()


def test_27_8_shard_data_numbers_are_checked_before_anything_is_written(tmp_path):
    (tmp_path / "in.txt").write_text("a\nb\nc\n")
    for extra, flag in ((["--shuffle", "--seed", "-5"], "--seed -5"),
                        (["--seed=-1"], "--seed -1"),
                        (["--suffix-length", "10000"], "--suffix-length 10000"),
                        (["--suffix-length=-1"], "--suffix-length -1")):
        proc = fluidctl("shard-data", "in.txt", "-n", 2, "-o", "out", *extra, cwd=tmp_path)
        one_line_error(proc, flag)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def numeric_options():
    """(command path, option) for every int/float option of every click command."""
    found = []
    group = cli._cli()

    def walk(command, path):
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), path + [name])
            return
        for param in command.params:
            if isinstance(param, click.Option) and param.type.name in (
                    "integer", "float", "integer range", "float range"):
                found.append((path, param))
    walk(group, [])
    return found


def test_27_8_every_numeric_option_refuses_nan_inf_and_out_of_range(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "in.txt").write_text("a\nb\n")
    options = numeric_options()
    assert len(options) >= 15, options
    # what a command needs besides the option for it to reach its checks
    base = {("shard-data",): ["in.txt", "-n", "2", "-o", "out"], ("train",): []}
    for path, param in options:
        low = getattr(param.type, "low", getattr(param.type, "min", None))
        above = getattr(param.type, "above", getattr(param.type, "min_open", False))
        values = ["nan", "inf", "-inf", "1e400"]
        if low is None or -1 < low or (above and -1 <= low):
            values.append("-1")
        for value in values:
            argv = [*path, *base.get(tuple(path), []), f"{param.opts[-1]}={value}"]
            with pytest.raises(SystemExit) as exit_:
                cli.main(argv)
            err = capsys.readouterr().err
            assert exit_.value.code == 2, (argv, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
            assert any(opt in lines[0] for opt in param.opts), (argv, err)
            assert not (tmp_path / "out").exists() and not (tmp_path / "mylog").exists(), argv
