"""fluidctl.fastargs, the click-free parser of the quick commands' plain forms, held to the
click commands it stands in for: the same options, and never a value click would not give."""
import os

import click
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidctl import fastargs
from fluidctl.cli import _cli


def click_command(path):
    command = _cli()
    for name in path:
        command = command.get_command(None, name)
    return command


def click_params(path, argv):
    """What click makes of ``argv`` (its values), or None where click refuses it."""
    try:
        return click_command(path).make_context(path[-1], list(argv)).params
    except click.ClickException:
        return None


@pytest.mark.parametrize("path", list(fastargs.COMMANDS))
def test_the_table_is_the_click_command_s(path, paths):
    table = fastargs.COMMANDS[path]
    command = click_command(path)
    absent = click_params(path, [])             # every value when nothing is given
    names = set()
    for param in command.params:
        if isinstance(param, click.Argument):
            dest, _, default, many = table.argument
            assert (param.name, absent[param.name], many) == (dest, default, param.nargs == -1)
            continue
        assert param.name in table.defaults, f"--{param.name} missing from fastargs"
        assert not param.envvar, f"--{param.name} reads an environment variable: not here"
        assert table.defaults[param.name] == absent[param.name], param.name
        for name in param.opts:
            names.add(name)
            dest, kind, _ = table.options[name]
            assert dest == param.name
            assert kind == (fastargs.FLAG if param.is_flag else
                            fastargs.MULTI if param.multiple else fastargs.VALUE), name
    assert set(table.options) == names - {"--help"}


SYNC = ("cluster", "sync")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """A directory with the relative paths the argvs name (src/, hosts.txt, ssh_config), made
    the working directory for this module's tests."""
    base = tmp_path_factory.mktemp("fastargs")
    (base / "src").mkdir()
    (base / "hosts.txt").write_text("node1\n")
    (base / "ssh_config").write_text("Host *\n")
    before = os.getcwd()
    os.chdir(base)
    yield base
    os.chdir(before)


def test_the_plain_forms_are_parsed_here_and_as_click_does(paths):
    plain = [
        [],
        ["src"],
        ["--hosts", "node1,node2", "--ssh-config", "ssh_config", "--remote-dir", "/d/{host}",
         "--exclude", "*.ckpt", "--exclude", "data", "--checksum", "--timeout", "3.5", "src"],
        ["src", "--hostfile=hosts.txt", "--accept-new-host-keys", "--timeout=30"],
        ["--hosts", "a", "--hosts", "b", "."],
    ]
    for argv in plain:
        parsed = fastargs.COMMANDS[SYNC].parse(argv)
        assert parsed is not None, argv
        assert parsed == click_params(SYNC, argv), argv


@pytest.mark.parametrize("argv", [
    ["--help"], ["-h"], ["--hosts"], ["--timeout", "0"], ["--timeout", "nan"],
    ["--timeout", "x"], ["--checksum=yes"], ["missing-dir"], ["src", "src"],
    ["--hostfile", "src"], ["--hosts", "-x"], ["--exclude"], ["--remote"], ["--", "src"],
    ["-"],
])
def test_anything_else_is_left_to_click(paths, argv):
    """Left to click: its help, and its own wording of every mistake."""
    assert fastargs.COMMANDS[SYNC].parse(argv) is None


WORDS = {
    SYNC: ["--hosts", "--hostfile", "--ssh-config", "--timeout", "--remote-dir", "--exclude",
           "--checksum", "--accept-new-host-keys", "--timeout=2", "--checksum=1",
           "--hostfile=hosts.txt", "--nope", "-h", "-", "--", "src", "hosts.txt", "ssh_config",
           "missing", ".", "0", "0.05", "1e3", "inf", "nan", " 7 ", "a,b", "x=y", "-x", "",
           "{host}"],
    ("shard-data",): ["-n", "--trainers", "-o", "--output", "--verify", "--by", "--format",
                      "--shuffle", "--seed", "--name", "--suffix-length", "--equalize",
                      "--checksum", "--force", "--to-hosts", "--remote-dir", "--ssh-config",
                      "--accept-new-host-keys", "-q", "--quiet", "-qn", "-n4", "--trainers=2",
                      "--by=files", "--nope", "-", "--", "lines", "files", "jsonl", "csv", "pad",
                      "sha256", "xxh3-128", "none", "4", "-1", "0", " 3", "1_0", "x", "", "shards/",
                      "train.txt", "*.txt"],
}


@pytest.mark.parametrize("path", list(WORDS))
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_argv_is_read_otherwise_than_click_reads_it(paths, path, data):
    """Over argvs made of option names, values and paths in any order: where fastargs gives
    values, click accepts the same argv and gives the same values."""
    argv = data.draw(st.lists(st.sampled_from(WORDS[path]), max_size=7))
    parsed = fastargs.COMMANDS[path].parse(argv)
    if parsed is not None:
        assert parsed == click_params(path, argv), argv


def test_shard_data_s_plain_forms_are_parsed_here(paths):
    for argv in (["train.txt", "--trainers", "4", "-o", "shards/"],
                 ["a.txt", "b.txt", "-n", "2", "-o", "out", "--equalize", "pad", "-q",
                  "--checksum=sha256", "--shuffle", "--seed", "7"],
                 ["--verify", "shards/"]):
        parsed = fastargs.COMMANDS[("shard-data",)].parse(argv)
        assert parsed is not None, argv
        assert parsed == click_params(("shard-data",), argv), argv
    for argv in (["-qn", "2"], ["-n4"], ["--by", "bytes"], ["--help"], ["-n", "-2"]):
        assert fastargs.COMMANDS[("shard-data",)].parse(argv) is None, argv


def test_version_is_printed_as_click_prints_it(capsys):
    """``fluidctl --version`` answers before click is imported, in click's own words."""
    from fluidctl.cli import main
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as ended:
            main([flag])
        assert ended.value.code == 0
        fast = capsys.readouterr().out
        with pytest.raises(SystemExit):
            _cli().main(args=[flag], prog_name="fluidctl")
        assert fast == capsys.readouterr().out != ""
