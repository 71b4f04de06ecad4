"""Regenerate the example outputs of README.md and docs/*.md by running the commands they show.

    python docs/regen.py                 # rewrite every `local` block (run from the checkout)
    python docs/regen.py --slow          # the `local-slow` ones too (torch, Paddle: minutes)
    python docs/regen.py --check         # exit 1 where a block no longer looks like its output

A block is regenerated when the line before its opening fence is a marker:

    <!-- regen: local -->                         each `$ COMMAND` line is run, its output below it
    <!-- regen: local keep="REGEX" -->            only output lines matching REGEX, the rest `[...]`
    <!-- regen: local-slow ... -->                 the same, run only with --slow: torch, Paddle,
                                                  mpirun, and reports whose timing a loaded
                                                  machine changes (stragglers)
    <!-- regen: local cmd="COMMAND" from="TEXT" -->  the block is COMMAND's output from TEXT on

Commands run with bash in a scratch directory that looks like a reader's checkout (templates/,
tests/, a train.py), with stdout and stderr together, as a terminal shows them; `echo $?` shows
the previous command's exit code. What differs from one machine to the next is written as a
reader's would be: the scratch directory as /home/me/proj, the interpreter as /usr/bin/python3,
the host name as node1. --check compares the distinct lines with the numbers masked, sorted
(pids, times and the order ranks print in vary run to run), so it fails on a changed message,
a line that came or went, not on a different pid; it prints what differs.
"""
import argparse
import difflib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- regen: ([\w-]+)(.*?) -->\n```(\w*)\n(.*?)^```\n", re.S | re.M)
ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
HOME = "/home/me/proj"
WRAP = 200          # fluidctl's console width off a terminal (fluidctl/console.py)
# `sbatch --test-only` as a cluster answers it, so that --dry-run prints the batch script here
SBATCH_STUB = "#!/bin/sh\necho 'sbatch: Job 1 to start at now using 2 processors' >&2\n"


class Marked:
    def __init__(self, path: Path, match: re.Match):
        self.path, self.match = path, match
        self.kind, self.lang, self.text = match.group(1), match.group(3), match.group(4)
        self.attrs = {k: v.replace('\\"', '"') for k, v in ATTR.findall(match.group(2))}
        self.line = path.read_text().count("\n", 0, match.start()) + 1

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if ROOT in self.path.parents else self.path
        return f"{path}:{self.line}"


def marked_blocks(paths=DOCS):
    for path in paths:
        for match in MARKED.finditer(path.read_text()):
            yield Marked(path, match)


def workspace() -> Path:
    work = Path(tempfile.mkdtemp(prefix="fluidctl-regen-"))
    for name in ("templates", "tests"):
        (work / name).symlink_to(ROOT / name)
    (work / "train.py").write_text("print('training')\n")
    (work / "train.txt").write_text("".join(f"record {i}: some words of a sample\n"
                                            for i in range(1000)))
    stub = work / ".stub"
    stub.mkdir()
    (stub / "sbatch").write_text(SBATCH_STUB)
    (stub / "sbatch").chmod(0o755)
    return work


def run(command: str, work: Path) -> subprocess.CompletedProcess:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{work / '.stub'}:{os.environ['PATH']}",
           "FLUIDCTL_STATE_DIR": str(work / ".state"), "COLUMNS": "200"}
    try:
        return subprocess.run(["bash", "-c", command], cwd=work, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(command, 124, (exc.stdout or b"").decode(), "")


def as_a_reader_sees_it(text: str, work: Path) -> str:
    for path in {str(work), os.path.realpath(work)}:
        text = text.replace(path, HOME)
    text = re.sub(re.escape(str(Path(sys.executable).parent)) + r"/python[\d.]*", "/usr/bin/python3",
                  text.replace(str(ROOT), HOME))
    host = socket.gethostname().split(".")[0]
    return re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", "node1", text) if host else text


def keep_only(lines, pattern: str):
    """The lines matching pattern, and the continuation of one that fluidctl's console wrapped
    (at WRAP columns off a terminal); each run of others becomes one ``[...]``."""
    kept, regex, previous_kept = [], re.compile(pattern), ""
    for line in lines:
        wrapped = previous_kept and len(previous_kept.rstrip()) + 1 + len(
            line.split(" ")[0]) > WRAP and line[:1] != " "
        previous_kept = ""
        if regex.search(line) or wrapped:
            kept.append(line)
            previous_kept = line
        elif not kept or kept[-1] != "[...]":
            kept.append("[...]")
    return kept


def regenerate(block: Marked, work: Path) -> str:
    if "cmd" in block.attrs:
        out = as_a_reader_sees_it(run(block.attrs["cmd"], work).stdout, work)
        start = block.attrs.get("from")
        if start and start in out:
            out = out[out.index(start):]
        return out.rstrip("\n") + "\n"
    lines, rc = [], 0
    for command in [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]:
        lines.append(f"$ {command}")
        if command.strip() == "echo $?":
            lines.append(str(rc))
            continue
        res = run(command, work)
        rc = res.returncode
        out = as_a_reader_sees_it(res.stdout, work).rstrip("\n").splitlines()
        lines += keep_only(out, block.attrs["keep"]) if "keep" in block.attrs else out
    return "\n".join(lines) + "\n"


def shape(text: str):
    """What --check compares: the distinct lines, numbers masked, in sorted order (a line a
    report repeats as the job goes on may come once or twice)."""
    return sorted({re.sub(r"\d+", "N", line).rstrip() for line in text.splitlines()})


def regen_files(paths, kinds, work: Path, check: bool):
    """Regenerate the marked blocks of kinds in paths (rewriting them unless check); the blocks
    whose shape changed."""
    stale = []
    for path in paths:
        text = path.read_text()
        new = text
        changed = []
        for block in reversed([b for b in marked_blocks([path]) if b.kind in kinds]):
            body = regenerate(block, work)
            if shape(body) != shape(block.text):
                changed.insert(0, block.where)
                if check:
                    diff = difflib.unified_diff(shape(block.text), shape(body), "documented",
                                                "printed now", lineterm="", n=0)
                    print(f"{block.where}:", *list(diff)[:20], sep="\n", file=sys.stderr)
            m = block.match
            new = new[:m.start(4)] + body + new[m.end(4):]
        if not check and new != text:
            path.write_text(new)
        stale += changed
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    ap.add_argument("--slow", action="store_true", help="the local-slow blocks too")
    ap.add_argument("paths", nargs="*", help="only these files (default: README.md, docs/*.md)")
    args = ap.parse_args(argv)
    paths = [Path(p).resolve() for p in args.paths] or DOCS
    kinds = {"local", "local-slow"} if args.slow else {"local"}
    work, stale = workspace(), []
    try:
        stale = regen_files(paths, kinds, work, args.check)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.check and stale:
        print("these example outputs differ from what the commands print now "
              f"(python docs/regen.py rewrites them): {', '.join(stale)}", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'regenerated'} the {'/'.join(sorted(kinds))} blocks"
          f"{': ' + ', '.join(stale) + ' changed' if stale and not args.check else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
