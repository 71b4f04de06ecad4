"""The README's quick start stays two commands, and CI runs exactly the second one; every
fluidctl command line of README.md and docs/*.md parses, and those that need no cluster work
here (tests/e2e/test_docs_run.py runs the ones that start processes)."""
import re

import pytest

from docblocks import quick_start_block, quick_start_commands
from launchutil import ROOT


def test_quick_start_is_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert "fluidctl train --nproc 2" in commands[0]
    assert "pytest" in commands[1]


def test_the_demo_command_reads_line_by_line_with_a_heading_per_demo():
    """Command 1 is one step a line, and each demo prints a heading before its output."""
    lines = quick_start_block().split("\n\n")[0].splitlines()[1:]
    assert len(lines) > 5 and all(len(line) <= 100 for line in lines), lines
    assert len([line for line in lines if line.startswith("echo '== ")]) == 3


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = quick_start_commands()[1]
    install_and_test = readme_cmd.split("; ", 1)[1]       # after the exports
    assert install_and_test in ci
    for name in re.findall(r"export (.*?);", readme_cmd)[0].split():
        assert name in ci


# --- every fluidctl command line of README.md and docs/*.md parses ----------------------------
def click_parse(argv):
    """``fluidctl ARGV`` through the real click group down to its command's context: every
    option name, value type and argument checked as a run would, nothing run."""
    import click
    from fluidctl.cli import _cli
    cmd, name = _cli(), "fluidctl"
    ctx = cmd.make_context(name, list(argv), resilient_parsing=False)
    while isinstance(cmd, click.Group):
        args = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        name, cmd, rest = cmd.resolve_command(ctx, args)
        ctx = cmd.make_context(name, rest, parent=ctx, resilient_parsing=False)
    return ctx


def documented_commands():
    from docblocks import blocks, fluidctl_commands, shell_lines
    return [(block.where, argv) for block in blocks() for line in shell_lines(block)
            for argv in fluidctl_commands(line)]


def test_documented_commands_are_found():
    """The walker sees the blocks it is meant to: each command of fluidctl, from README and
    every page of docs/."""
    found = documented_commands()
    assert len(found) > 60, found
    assert {argv[0] for _, argv in found} >= {"train", "shard-data", "cluster", "pserver", "job",
                                              "worker", "dump"}
    assert {where.split(":")[0] for where, _ in found} >= {
        "README.md", "docs/multi-node.md", "docs/slurm.md", "docs/pserver.md",
        "docs/shard-data.md"}


def test_every_documented_fluidctl_command_parses(tmp_path, monkeypatch):
    """Issue 25's 'every command in README and docs/ works as written': each fluidctl line of
    every fenced block (synopses opened up, placeholders filled in) is accepted by the CLI."""
    import click
    monkeypatch.chdir(tmp_path)
    wrong = []
    for where, argv in documented_commands():
        try:
            click_parse(argv)
        except click.exceptions.Exit:               # --help, --version
            pass
        except click.ClickException as exc:
            wrong.append(f"{where}: fluidctl {' '.join(argv)}: {exc.format_message()}")
    assert wrong == [], "\n".join(wrong)


# Why a documented command is only parsed above, not run here (first match wins).
NOT_RUN_HERE = [
    (lambda a: a[0] == "train" and ({"--hostfile", "--hosts"} & set(a)),
     "needs sshd nodes (tests/cluster runs these)"),
    (lambda a: a[0] == "train" and "slurm" in a, "needs a Slurm cluster (tests/cluster)"),
    (lambda a: a[0] == "train" and "--gpus" in a, "needs GPUs (tests/gpu)"),
    (lambda a: a[0] == "train" and "--pserver-endpoints" in a,
     "needs pservers already running elsewhere"),
    (lambda a: a[0] == "cluster", "needs sshd nodes (tests/cluster)"),
    (lambda a: "--apply" in a or a[:2] == ["job", "list"] and "--k8s" in a
     or a[:2] == ["job", "checkpoint"] and "/" in a[2],
     "submits to a Kubernetes API server (tests/unit/test_k8s_render.py fakes one)"),
    (lambda a: a[0] == "worker", "the per-rank entry that mpirun or srun starts"),
    (lambda a: a[0] in ("dump", "top"), "needs a running job"),
    (lambda a: a[0] == "report", "needs a job's log dir (tests/e2e/test_report.py)"),
    (lambda a: a[:2] in (["job", "status"], ["job", "logs"], ["job", "cancel"]),
     "needs a submitted Slurm job"),
    (lambda a: a[:2] in (["pserver", "start"], ["pserver", "stop"]) and "--all" not in a,
     "starts or stops a daemon (tests/e2e/test_pserver_cli.py)"),
    (lambda a: "demo.txt" in a or "templates/train_nccl2.py" in a,
     "the quick start's chain (tests/e2e/test_docs_run.py runs it whole)"),
]


def not_run_here(argv) -> str:
    return next((why for test, why in NOT_RUN_HERE if test(argv)), "")


def test_documented_local_commands_work_here(capsys, tmp_path, monkeypatch):
    """The documented commands that need no cluster run in this process, from a directory
    holding the files they name: local train lines as --dry-run (the whole LaunchConfig
    check and the plan), shard-data for real on a small file, pserver status, job list."""
    from fluidctl import cli
    from launchutil import ROOT
    for name in ("templates", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "train.py").write_text("print('ok')\n")
    (tmp_path / "train.txt").write_text("".join(f"record {i}\n" for i in range(100)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path / "state"))
    ran, wrong = [], []
    for where, argv in documented_commands():
        if not_run_here(argv):
            continue
        if argv[0] == "train":
            argv = ["train", "--dry-run", *argv[1:]]
        if argv[0] == "shard-data":
            argv = [*argv, "--force", "-q"]
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        out, err = capsys.readouterr()
        ran.append(argv[:2])
        if exit_.value.code not in (None, 0):
            wrong.append(f"{where}: fluidctl {' '.join(argv)}: exit {exit_.value.code}: {err}")
    assert wrong == [], "\n".join(wrong)
    assert ["shard-data", "train.txt"] in ran and ["pserver", "status"] in ran
    assert len([a for a in ran if a[0] == "train"]) >= 8, ran
