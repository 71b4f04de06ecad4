"""The CLI in-process: ``fluidctl.cli.main([...])`` with capsys, no subprocess. Bad input is one
``error:`` line and exit 2 with nothing written; ``--dry-run`` prints the plan and starts
nothing. tests/e2e/test_train.py holds the same contract for the real command."""
import json
import socket

import pytest

from fluidctl import __version__, cli

from launchutil import BEHAVE
from badinput import TRAIN_BAD_INPUT


def run_cli(capsys, *args):
    """(exit code, stdout, stderr) of ``fluidctl ARGS`` run in this process."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    code = exit_.value.code
    return (0 if code is None else code), out, err


@pytest.fixture
def busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


BAD_INPUT = TRAIN_BAD_INPUT


@pytest.mark.parametrize("args,message", BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, busy_port, args,
                                          message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    args = [a.format(behave=BEHAVE, busy=busy_port, tmp=tmp_path) for a in args]
    code, out, err = run_cli(capsys, "train", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert out == "" and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]     # nothing written


def test_version(capsys):
    assert run_cli(capsys, "--version") == (0, f"fluidctl, version {__version__}\n", "")


def test_dry_run_json_is_the_plan_and_starts_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--nproc", 3, "--env", "FOO=bar", "--dry-run",
                             "--json", BEHAVE, "--lr", "0.1")
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["backend"], plan["mode"], plan["commands"]) == ("local", "collective", [])
    procs = plan["procs"]
    assert [p["rank"] for p in procs] == [0, 1, 2]
    assert [p["endpoint"] for p in procs] == plan["trainer_endpoints"]
    assert len(set(plan["trainer_endpoints"]) | {plan["master"]}) == 4
    for rank, proc in enumerate(procs):
        env = proc["env"]
        assert env["PADDLE_TRAINER_ID"] == env["RANK"] == str(rank)
        assert env["PADDLE_TRAINERS_NUM"] == env["WORLD_SIZE"] == "3"
        assert env["PADDLE_MASTER"] == plan["master"] and env["FOO"] == "bar"
        assert proc["argv"][-3:] == [BEHAVE, "--lr", "0.1"]
        assert proc["log"].endswith(f"workerlog.{rank}")
    assert list(tmp_path.iterdir()) == []                     # no log dir: nothing ran


def test_dry_run_table_names_every_rank(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, err = run_cli(capsys, "train", "--nproc", 2, "--dry-run", BEHAVE)
    assert code == 0, err
    plan_json = json.loads(run_cli(capsys, "train", "--nproc", 2, "--dry-run", "--json",
                                   BEHAVE)[1])
    assert "workerlog.0" in out and "workerlog.1" in out
    assert plan_json["procs"][1]["log"].endswith("workerlog.1")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("group", [[], ["job"], ["cluster"], ["pserver"]])
def test_bare_group_prints_its_help_intact(capsys, group):
    """As click does standalone: the help, line by line, on stderr, exit 2; not one error line."""
    code, out, err = run_cli(capsys, *group)
    assert code == 2 and out == ""
    assert err.startswith("Usage: fluidctl"), err
    assert "\nCommands:\n" in err and len(err.splitlines()) > 8
    assert not err.startswith("error:")
