"""fluidctl.fastargs, the click-free parser of the quick commands' plain forms, held to the
click commands it stands in for: the same options, and never a value click would not give."""
import os

import click
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidctl import fastargs, trainargs
from fluidctl.cli import _cli

COMMANDS = {**fastargs.COMMANDS, ("train",): trainargs.TRAIN}


def click_command(path):
    command = _cli()
    for name in path:
        command = command.get_command(None, name)
    return command


def same(parsed, clicked) -> bool:
    """The same values (nan equal to nan: a float option may be given it)."""
    return parsed.keys() == clicked.keys() and all(
        repr(parsed[k]) == repr(clicked[k]) for k in parsed)


def click_params(path, argv):
    """What click makes of ``argv`` (its values), or None where click refuses it."""
    try:
        return click_command(path).make_context(path[-1], list(argv)).params
    except click.ClickException:
        return None


# the shortest argv click accepts, where it is not []
MINIMAL = {("train",): ["x.py"]}


@pytest.mark.parametrize("path", list(COMMANDS))
def test_the_table_is_the_click_command_s(path, paths, monkeypatch):
    """Each table and its click command have the same options and no other, each with its
    kind, destination, environment variable, help (where the table declares it: the quick
    commands' click options are built from it) and default."""
    for option in COMMANDS[path].declared:
        if option.envvar:
            monkeypatch.delenv(option.envvar, raising=False)
    table = COMMANDS[path]
    command = click_command(path)
    minimal = MINIMAL.get(path, [])
    absent = click_params(path, minimal)        # every value when nothing is given
    assert absent == table.parse(minimal)
    names = set()
    for param in command.params:
        if isinstance(param, click.Argument):
            if param.name == table.rest:
                assert param.nargs == -1 and command.context_settings.get(
                    "allow_interspersed_args", command.allow_interspersed_args) is False
                continue
            arg = table.argument
            assert (param.name, param.nargs == -1, param.required) == (
                arg.dest, arg.many, arg.required)
            if not arg.required:
                assert absent[param.name] == arg.default
            continue
        assert param.name in table.defaults, f"--{param.name} missing from fastargs"
        assert table.defaults[param.name] == absent[param.name], param.name
        for name, flag_value in [(n, True) for n in param.opts] + [
                (n, False) for n in param.secondary_opts]:
            names.add(name)
            declared = table.options[name]
            assert declared.dest == param.name and declared.envvar == param.envvar, name
            assert declared.help in ("", param.help), name
            assert declared.kind == (fastargs.FLAG if param.is_flag else
                                     fastargs.MULTI if param.multiple else fastargs.VALUE), name
            if param.is_flag:
                assert declared.flag_value is flag_value, name
    assert set(table.options) == names - {"--help", "-h"}


def test_the_other_cluster_commands_share_the_host_options():
    """check, exec and setup take --hostfile ... --accept-new-host-keys from the same table."""
    for name in ("check", "exec", "setup"):
        params = {p.name: p for p in click_command(("cluster", name)).params}
        for declared in fastargs.HOST_OPTIONS:
            assert params[declared.dest].help == declared.help, (name, declared.dest)


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
        parsed = COMMANDS[SYNC].parse(argv)
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
    assert COMMANDS[SYNC].parse(argv) is None


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
    ("train",): ["--nproc", "--nproc-per-node", "--gpus", "--mode", "--pservers", "--sync",
                 "--async", "--checkpoint-dir", "--checkpoint-every", "--hosts", "--backend",
                 "--nodes", "--slurm-arg", "--detach", "--venv", "--export", "--ssh-timeout",
                 "--started-port", "--env", "--grace-period", "--max-restarts", "--tee",
                 "--hang-timeout", "--log-tail", "--dry-run", "--json", "--sync=1", "--nproc=2",
                 "--tee=all", "--nope", "-h", "-n", "-", "--", "train.py", "src", "hosts.txt",
                 "pserver", "collective", "slurm", "mpi", "all", "none", "0", "1", "-1", "2.5",
                 "nan", "inf", " 3", "1_0", "x", "", "A=1", "node1:2"],
}


@pytest.mark.parametrize("path", list(WORDS))
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_argv_is_read_otherwise_than_click_reads_it(paths, path, data):
    """Over argvs made of option names, values and paths in any order: where fastargs gives
    values, click accepts the same argv and gives the same values."""
    argv = data.draw(st.lists(st.sampled_from(WORDS[path]), max_size=9 if path == ("train",)
                              else 7))
    parsed = COMMANDS[path].parse(argv)
    if parsed is not None:
        assert same(parsed, click_params(path, argv)), argv


def test_shard_data_s_plain_forms_are_parsed_here(paths):
    for argv in (["train.txt", "--trainers", "4", "-o", "shards/"],
                 ["a.txt", "b.txt", "-n", "2", "-o", "out", "--equalize", "pad", "-q",
                  "--checksum=sha256", "--shuffle", "--seed", "7"],
                 ["--verify", "shards/"]):
        parsed = COMMANDS[("shard-data",)].parse(argv)
        assert parsed is not None, argv
        assert parsed == click_params(("shard-data",), argv), argv
    for argv in (["-qn", "2"], ["-n4"], ["--by", "bytes"], ["--help"], ["-n", "-2"]):
        assert COMMANDS[("shard-data",)].parse(argv) is None, argv


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


TRAIN = ("train",)


def test_train_s_plain_forms_are_parsed_here(paths):
    for argv in (["train.py"],
                 ["--nproc", "4", "train.py", "--epochs", "3", "--nproc", "9"],
                 ["--gpus", "0,2", "--async", "--mode=pserver", "--pservers", "2", "t.py"],
                 ["--hosts", "a:2,b:2", "--backend", "slurm", "--nodes", "2", "--partition",
                  "gpu", "--export", "NCCL_*", "--env", "A=1", "--tee", "all",
                  "--hang-timeout", "600", "--dry-run", "--json", "t.py", "--", "-x"]):
        parsed = COMMANDS[TRAIN].parse(argv)
        assert parsed is not None, argv
        assert parsed == click_params(TRAIN, argv), argv
    for argv in ([], ["--help"], ["-h"], ["--nproc", "0", "t.py"], ["--", "t.py"],
                 ["--backend", "nomad", "t.py"], ["--checkpoint-dir", "hosts.txt", "t.py"],
                 ["--log-tail", "-1", "t.py"], ["--sync=yes", "t.py"], ["-"],
                 ["--slurm-arg=--mail-type=END", "t.py"]):       # a value like an option
        assert COMMANDS[TRAIN].parse(argv) is None, argv


@pytest.mark.parametrize("venv, hang", [("/opt/env", "600"), ("", ""), ("-v", "abc"),
                                        ("/e", "nan")])
def test_train_reads_the_environment_as_click_does(paths, monkeypatch, venv, hang):
    """--venv and --hang-timeout fall back to FLUIDCTL_VENV and FLUIDCTL_HANG_TIMEOUT (an
    empty one is unset); a value click might refuse is left to click."""
    monkeypatch.setenv("FLUIDCTL_VENV", venv)
    monkeypatch.setenv("FLUIDCTL_HANG_TIMEOUT", hang)
    for argv in (["t.py"], ["--venv", "/given", "--hang-timeout", "5", "t.py"]):
        parsed = COMMANDS[TRAIN].parse(argv)
        if parsed is not None:
            assert same(parsed, click_params(TRAIN, argv)), argv
        else:
            # click refuses these (nan is no hang timeout): click words the error
            assert argv == ["t.py"] and (venv, hang) in (("-v", "abc"), ("/e", "nan")), argv
