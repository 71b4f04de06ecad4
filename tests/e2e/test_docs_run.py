"""README.md's and docs/*.md's blocks that run on this machine without a cluster, run as a
reader would run them (tests/unit/test_readme.py parses every fluidctl line of every block and
runs the in-process ones): the quick start's demos, the shard-data session, a transcript's
output, the runtime's Python examples, the completion lines."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from docblocks import blocks, python_blocks, quick_start_commands, shell_lines
from launchutil import ROOT

BIN = str(Path(sys.executable).parent)     # `fluidctl` and `python3` as a reader's venv has them

# Python blocks not run here, and why.
PYTHON_NOT_RUN = {
    "docs/architecture.md": "the files of a backend package (\"Adding a backend\"), which "
                            "tests/e2e/test_backend_entry_point.py installs and runs",
    "docs/pserver.md": "a training loop over the user's own `data` and `model`, against "
                       "running pservers (tests/e2e/test_pserver_e2e.py runs the client)",
    "docs/multi-node.md": "MPI's own initialisation, for scripts run under mpirun "
                          "(tests/cluster/test_mpi_programs.py)",
}
# What the fragments use without defining it (the reader's own arrays), same shapes as the docs.
PRELUDE = """import numpy as np
x = np.ones(1024, np.float32)
x2d = np.ones((4, 8), np.float32)
params = {"w": np.zeros((16, 4), np.float32), "b": np.zeros(4, np.float32)}
grads = {"w": np.ones((16, 4), np.float32), "b": np.ones(4, np.float32)}
epochs = 1
"""


def shell(command: str, cwd, timeout=120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
                               "FLUIDCTL_STATE_DIR": str(Path(cwd) / "state"), **(env or {})})


@pytest.fixture
def workspace(tmp_path):
    """A directory as a reader's checkout looks from the docs' commands: templates/, tests/."""
    for name in ("templates", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def test_readme_quick_start_demos_run_as_written(workspace):
    """README command 1, as written, after its install step (this checkout is installed in
    the interpreter running the tests): each demo prints its heading, then its output."""
    first = quick_start_commands()[0]
    install, demos = first.split(" && ", 1)
    assert "pip install" in install
    res = shell(demos, workspace, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    headings = [line for line in res.stdout.splitlines() if line.startswith("== ")]
    assert headings == [h.strip("'") for h in re.findall(r"echo ('== .*?')", demos)], res.stdout
    for heading, after in zip(headings, res.stdout.split("\n== ")[1:]):
        assert len(after.splitlines()) > 1, f"nothing under {heading!r}:\n{res.stdout}"


def test_shard_data_session_runs_as_documented(workspace):
    """docs/shard-data.md's first session: the commands run and `ls` shows what it shows."""
    block = next(b for b in blocks() if b.path.name == "shard-data.md"
                 and b.text.startswith("$ fluidctl shard-data train.txt"))
    (workspace / "train.txt").write_text("".join(f"record {i}\n" for i in range(1000)))
    session = []                            # (command, the lines the page shows it print)
    for line in block.text.splitlines():
        if line.startswith("$ "):
            session.append((line[2:], []))
        else:
            session[-1][1].append(line)
    for command, shown in session:
        res = shell(command, workspace)
        assert res.returncode == 0, (command, res.stdout, res.stderr)
        if command.startswith("ls "):
            assert res.stdout.split() == " ".join(shown).split(), res.stdout


def test_readme_tee_ranks_transcript_is_what_it_prints(workspace):
    """README's --tee-ranks transcript: each rank's lines, in order, as the block shows them
    (ranks interleave as they run)."""
    block = next(b for b in blocks() if "--tee-ranks 0,2" in b.text and b.text.startswith("$"))
    command, *shown = block.text.splitlines()
    res = shell(command[2:], workspace)
    assert res.returncode == 0, res.stderr

    def by_rank(lines):
        ranks = {}
        for line in lines:
            ranks.setdefault(line.split("]")[0], []).append(line)
        return ranks
    assert by_rank(res.stdout.splitlines()) == by_rank(shown), res.stdout


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_python_examples_run(block, workspace):
    """The runtime's examples, under the launcher they are written for (fluidctl train with
    2 ranks; the shard reader as trainer 1 of 4 next to a shard-data output), after a prelude
    that defines the arrays they take as given."""
    page = str(block.path.relative_to(ROOT))
    if page in PYTHON_NOT_RUN:
        pytest.skip(PYTHON_NOT_RUN[page])
    (workspace / "example.py").write_text(PRELUDE + block.text)
    if "ShardReader" in block.text:
        (workspace / "train.txt").write_text("".join(f"record {i}\n" for i in range(1000)))
        layout = "--shards 4 -o canon/" if '"canon/"' in block.text else "--trainers 4 -o shards/"
        command = f"fluidctl shard-data train.txt {layout} -q && python3 example.py"
        env = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "4"}
    else:
        command, env = "fluidctl train --nproc 2 example.py", {}
    res = shell(command, workspace, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_completion_lines_print_a_script():
    """README's completion lines: each shell's script comes out of fluidctl."""
    block = next(b for b in blocks() if "_FLUIDCTL_COMPLETE" in b.text)
    for line in shell_lines(block):
        found = re.search(r"(_FLUIDCTL_COMPLETE=\w+) fluidctl", line)
        name, value = found[1].split("=")
        res = subprocess.run([f"{BIN}/fluidctl"], env={**os.environ, name: value},
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "_FLUIDCTL_COMPLETE" in res.stdout, (line, res.stderr)
        assert shlex.split(line)        # the line itself is shell a reader can paste


def test_example_outputs_are_what_the_commands_print():
    """The marked example outputs of README.md and docs/ that need no cluster (hang, failure and
    straggler reports, the shard-data summary, the Slurm batch script, the Kubernetes YAML)
    are what the commands print now: docs/regen.py --check reruns them (numbers masked)."""
    res = subprocess.run([sys.executable, str(ROOT / "docs" / "regen.py"), "--check"],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "checked the local blocks" in res.stdout


def test_regen_rewrites_a_stale_output_and_check_fails_on_it(tmp_path):
    """docs/regen.py --check fails on an output that is not what its command prints (numbers
    aside), and a plain run rewrites it; `keep` cuts the lines it does not match."""
    page = tmp_path / "page.md"
    page.write_text("<!-- regen: local -->\n```\n$ echo hello 1; echo world\nbye 1\n```\n\n"
                    '<!-- regen: local keep="^\\$|two" -->\n```\n$ printf \'one\\ntwo\\n\'\n```\n')
    regen = [sys.executable, str(ROOT / "docs" / "regen.py")]
    res = subprocess.run([*regen, "--check", str(page)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and "page.md:1," in res.stderr, res.stderr
    subprocess.run([*regen, str(page)], check=True, capture_output=True, timeout=120)
    assert "$ echo hello 1; echo world\nhello 1\nworld\n```" in page.read_text()
    assert "[...]\ntwo\n" in page.read_text()
    page.write_text(page.read_text().replace("hello 1", "hello 2"))     # numbers are masked
    res = subprocess.run([*regen, "--check", str(page)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
