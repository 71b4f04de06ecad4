"""The README's quick start stays two commands, and CI runs exactly the second one."""
import re

from launchutil import ROOT


def quick_start_block() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"## Quick start.*?```sh\n(.*?)```", text, re.S).group(1)


def quick_start_commands():
    """The commands, lines ending in a backslash joined to the next as the shell does."""
    commands, pending = [], ""
    for line in quick_start_block().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        commands.append(pending + line)
        pending = ""
    return commands


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
