"""The fenced code blocks of README.md and docs/*.md, and the fluidctl command lines in them, as
a reader copies them: tests/unit/test_readme.py parses every such line through the real click
CLI, tests/e2e/test_docs_run.py runs the ones this machine can run without a cluster."""
import re
import shlex
from pathlib import Path

from launchutil import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# what a synopsis's placeholders stand for, so a synopsis line parses as a real one would
PLACEHOLDERS = {"N": "2", "JOB": "14", "DIR": "somedir", "OUT_DIR": "out", "INPUT": "train.txt",
                "SRC": ".", "SCRIPT": "train.py", "ARGS": "--epochs"}
LAUNCHERS = ("salloc", "srun", "mpirun", "sbatch")


class Block:
    def __init__(self, path: Path, line: int, lang: str, text: str):
        self.path, self.line, self.lang, self.text = path, line, lang, text

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def __repr__(self) -> str:
        return f"<block {self.where}>"


def blocks(paths=DOCS):
    """Every fenced block: (file, line of its opening fence, language, text)."""
    for path in paths:
        text = path.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            yield Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))


def shell_lines(block: Block):
    """The block's command lines: a transcript's ``$ `` lines only; elsewhere every line, with
    a trailing backslash joined to the next and a synopsis's indented continuation (a line
    that starts with ``[`` or ``-``) joined to the line above."""
    raw = block.text.splitlines()
    if any(line.startswith("$ ") for line in raw):
        return [line[2:] for line in raw if line.startswith("$ ")]
    lines, pending = [], ""
    for line in raw:
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if lines and line[:1].isspace() and line.strip()[:1] in ("[", "-"):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def fluidctl_commands(line: str):
    """The fluidctl argv(s) a shell line holds (after ``$ ``, variable assignments, ``salloc``,
    ``srun``, ``mpirun`` or ``python -m``), comments dropped, each of ``&&``/``;``'s commands;
    a synopsis's ``[...]`` opened, ``X...`` as X and placeholders filled in; ``a | b | c``
    after ``fluidctl job`` as the alternatives ``fluidctl job a`` ... ."""
    if "_FLUIDCTL_COMPLETE" in line:        # completion scripts: run, not parsed
        return []
    line = re.sub(r"\s\(see above\)", "", line)
    try:
        words = shlex.split(line.replace("[", " ").replace("]", " "), comments=True)
    except ValueError:
        return []
    commands, current = [], []
    for word in words + ["&&"]:
        if word in ("&&", ";", "||"):
            if current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    found = []
    for words in commands:
        if "fluidctl" not in words:
            continue
        before = words[:words.index("fluidctl")]
        if before and not (all("=" in w and not w.startswith("-") for w in before)
                           or before[0] in LAUNCHERS or before[0].endswith("python3")):
            continue                        # "fluidctl" in a message, not a command
        argv = words[words.index("fluidctl") + 1:]
        argv = [PLACEHOLDERS.get(w[:-3] if w.endswith("...") else w,
                                 w[:-3] if w.endswith("...") and len(w) > 3 else w)
                for w in argv]
        argv = [w for w in argv if w not in ("options", "...")]
        if "|" in argv:                     # `fluidctl job list | status JOB | ...`
            head, *rest = " ".join(argv).split(" | ")
            group = head.split()[:1]
            found += [head.split()] + [group + alt.split() for alt in rest]
        else:
            found.append(argv)
    return found


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


def python_blocks():
    return [b for b in blocks() if b.lang == "python"]
