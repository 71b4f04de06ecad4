"""The README's quick start stays two commands, and CI runs exactly the second one."""
import re

from launchutil import ROOT


def quick_start_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quick_start_is_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert "fluidctl train --nproc 2" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = quick_start_commands()[1]
    install_and_test = readme_cmd.split("; ", 1)[1]       # after the exports
    assert install_and_test in ci
    for name in re.findall(r"export (.*?);", readme_cmd)[0].split():
        assert name in ci
