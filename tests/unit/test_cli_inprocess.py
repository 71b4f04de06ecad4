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


@pytest.mark.parametrize("group", [["job"], ["cluster"], ["pserver"]])
def test_bare_group_prints_its_help_intact(capsys, group):
    """As click does standalone: the help, line by line, on stderr, exit 2; not one error line.
    (A bare `fluidctl` is its help on stdout, exit 0: tests/unit/test_walk_cli.py.)"""
    code, out, err = run_cli(capsys, *group)
    assert code == 2 and out == ""
    assert err.startswith("Usage: fluidctl"), err
    assert "\nCommands:\n" in err and len(err.splitlines()) > 8
    assert not err.startswith("error:")


def test_torchrun_spellings(capsys, tmp_path, monkeypatch):
    """--nproc_per_node and --nnodes mean what they mean in torchrun; --node_rank is refused
    in one line (fluidctl plans node ranks); --gpus all is every GPU (here: none, so refused)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--nproc_per_node", 3, "--nnodes", 1,
                             "--dry-run", "--json", BEHAVE)
    assert code == 0, err
    assert len([p for p in json.loads(out)["procs"] if p["role"] == "trainer"]) == 3
    for args, said in [(["--node_rank", 1], "--node-rank is torchrun's: fluidctl plans node ranks"),
                       (["--nnodes", 2], "--nodes 2, but without --hostfile or --hosts"),
                       (["--gpus", "all", "--backend", "mpi"], "--gpus all is not known"),
                       (["--gpus", "all"], "--gpus all: no GPUs found")]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        code, out, err = run_cli(capsys, "train", *args, "--dry-run", BEHAVE)
        assert code == 2 and err.startswith(f"error: {said}"), err
        assert len(err.splitlines()) == 1 and out == ""


@pytest.mark.parametrize("args,said", [
    (["trian"], "No such command 'trian'. Did you mean 'train'?"),
    (["clustr", "check"], "Did you mean 'cluster'?"),
    (["train", "--nproc_per_nod", 2, "x.py"], "Did you mean"),
])
def test_a_misspelt_command_or_option_gets_a_suggestion(capsys, args, said):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and said in err and len(err.splitlines()) == 1, err


def test_a_missing_token_file_says_how_to_make_one(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--token-file", tmp_path / "nope", "--dry-run",
                           BEHAVE)
    assert code == 2 and len(err.splitlines()) == 1
    assert 'python -c "import secrets; print(secrets.token_hex(32))" > token; chmod 600 token' \
        in err


def test_several_nodes_errors_are_a_summary_and_one_line_each(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--hosts", "n1.invalid:1,n2.invalid:1",
                             "--dry-run", BEHAVE)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 3, err
    assert lines[0].startswith("error: 2 of 2 node(s) could not start the job (")
    assert lines[1].startswith("  node n1.invalid: cannot resolve n1.invalid")
    assert lines[2].startswith("  node n2.invalid: cannot resolve n2.invalid")
    code, out, err = run_cli(capsys, "train", "--hosts", "n1.invalid:1", "--dry-run", BEHAVE)
    assert code == 2 and err.startswith("error: node n1.invalid could not start the job: "
                                        "cannot resolve")
    assert len(err.splitlines()) == 1


def test_dry_run_into_a_pipe_is_plain_columns_and_one_line_per_command(capsys, tmp_path,
                                                                       monkeypatch):
    """No box characters off a terminal; each command once, on its own line, below the table
    (in a table cell it wrapped over 7 lines at 80 columns)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--nproc", 2, "--mode", "pserver", "--dry-run",
                             BEHAVE, "--lr", "0.1")
    assert code == 0, err
    assert not set("│┃┏━") & set(out)
    lines = out.splitlines()
    assert lines[1].split(" | ") == ["rank", "role   ", "host     ", "endpoint       ",
                                     "devices", "log"]
    at = lines.index("commands:")
    assert lines[at + 1].startswith("  pserver 0: ")
    assert lines[at + 2].startswith("  trainer 0,1: ") and lines[at + 2].endswith(
        f"-u {BEHAVE} --lr 0.1")


def test_pserver_status_into_a_pipe_is_plain_columns(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path))
    (tmp_path / "pserver-7164.json").write_text(json.dumps(
        {"pid": 999999999, "port": 7164, "endpoint": "127.0.0.1:7164", "trainers": 2}))
    code, out, err = run_cli(capsys, "pserver", "status")
    assert code == 0, err
    assert not set("│┃┏━") & set(out)
    assert out.splitlines()[2].split(" | ")[:3] == ["127.0.0.1:7164", "999999999", "dead "]


@pytest.mark.parametrize("args,said", [
    (["--show-secrets"], "--show-secrets only works with --dry-run --json"),
    (["--dry-run", "--show-secrets"], "--show-secrets only works with --dry-run --json"),
    (["--dry-run", "--tee", "all", "--tee-ranks", "0"], "--tee all and --tee-ranks both given"),
    (["--dry-run", "--tee", "none", "--tee-ranks", "0"], "--tee none and --tee-ranks both"),
])
def test_conflicting_options_are_refused(capsys, tmp_path, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", *args, BEHAVE)
    assert code == 2 and out == "" and err.startswith(f"error: {said}"), err
    assert len(err.splitlines()) == 1


def test_nproc_against_hostfile_slots_is_a_warning(capsys, tmp_path, monkeypatch):
    """slots= wins (as --hostfile's help says); --nproc that disagrees gets one warning line."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--hosts", "n1.invalid:2,n2.invalid", "--nproc", 3,
                             "--dry-run", BEHAVE)
    assert code == 2        # the nodes cannot be reached; the warning came first
    assert err.splitlines()[0] == ("warning: --nproc 3 does not apply to n1.invalid (slots=2): "
                                   "a hostfile's slots= is its node's trainer count (drop "
                                   "--nproc, or change slots=)")
    code, out, err = run_cli(capsys, "train", "--hosts", "n1.invalid:3", "--nproc", 3,
                             "--dry-run", BEHAVE)
    assert "warning" not in err


def test_shard_data_warns_when_shards_hold_different_counts(capsys, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("a\nbb\n" + "c" * 40 + "\nd\ne\n")
    code, out, err = run_cli(capsys, "shard-data", data, "--trainers", 2, "-o", tmp_path / "s")
    assert code == 0
    assert err == ("warning: the shards hold 2 to 3 records: a collective job stalls at its "
                   "last step, the trainers with more waiting for the ones that ran out (add "
                   "--equalize pad or --equalize truncate)\n")
    for equalize in ("pad", "truncate"):
        code, out, err = run_cli(capsys, "shard-data", data, "--trainers", 2, "-o",
                                 tmp_path / equalize, "--equalize", equalize)
        assert code == 0 and err == ""
