"""README.md and docs/*.md speak to users: no history (commit hashes, "fixed in", "Goals: met"),
no developer paths or host names in example output, no "this machine"; and docs/performance.md's
table is bench/results.json as bench/render_results.py renders it."""
import json
import re
import subprocess
import sys

import pytest

from docblocks import DOCS
from launchutil import ROOT

HEX = re.compile(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w/-])")
# history, whether or not the hash is one of this clone's commits
HISTORY = re.compile(r"\b(commit|fixed in|tree of|at|since)\s+[0-9a-f]{7,40}\b|"
                     r"\b[0-9a-f]{7,40}'s parent\b|\bfixed in\b|\bused to\b|\bgoals?: (met|missed)|"
                     r"\bgoal\b.*\*\*missed\*\*|\bthe seeds'|\bold and new tree\b|not measured yet",
                     re.I)
PATHS = re.compile(r"(?<![\w.])(/tmp/[\w.-]|/var/tmp/[\w.-]|/var/folders/|/work/|/root/|"
                   r"/home/(?!me/)[\w.-]+/|\bwt/i\d+\b)")
HOSTS = re.compile(r"\bthis (machine|vm|host|box)\b|\bon vm\b|\bin this vm\b", re.I)


def commits():
    """Every commit of this clone, full hashes; none where there is no git history."""
    try:
        res = subprocess.run(["git", "rev-list", "--all"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return res.stdout.split() if res.returncode == 0 else []


def offences(text: str, known_commits) -> list:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern, what in ((HISTORY, "history"), (PATHS, "a developer path"),
                              (HOSTS, "this machine")):
            m = pattern.search(line)
            if m:
                found.append(f"{n}: {what}: {m.group(0)!r}")
        for word in HEX.findall(line):
            if any(c.startswith(word) for c in known_commits):
                found.append(f"{n}: a commit hash: {word!r}")
    if not found:       # phrases broken over two lines
        for pattern, what in ((HISTORY, "history"), (HOSTS, "this machine")):
            m = pattern.search(" ".join(text.split()))
            if m:
                found.append(f"a line break inside: {what}: {m.group(0)!r}")
    return found


def test_the_checks_catch_what_they_are_for():
    """Each kind of offence the issue found is caught; the placeholders the docs use are not."""
    bad = ["on the tree of commit 4225574", "fixed in a4cc71d", "a4cc71d's parent",
           "**Goals: met at 256 MiB", "This is the seeds' RPC mode",
           '  File "/work/wt/i14/tests/scripts/trouble.py", line 41',
           "starting at step 759 (from /tmp/p29doc/run/ckpt/step-000000758)",
           "rank 0/6 local 0/1 on vm pid 22308", "in this VM a wake-up costs", "from this machine",
           "each rank's log is `LOG_DIR/<host>/workerlog.N` on this\nmachine: the failure report",
           "abc1234 started it"]
    for line in bad:
        assert offences(line, ["abc1234" + "0" * 33]), line
    good = ['  |   File "/home/me/proj/tests/scripts/trouble.py", line 53',
            "train.txt-00000 |     253 | 8,745 | xxh3-128 1ba1b9b1c0cb1a5e",
            "every rank's full stack: mylog/hang-20261128-003715/",
            "python bench/preempt.py --repeat 5 --dir /var/tmp", "the nodes refused to start"]
    for line in good:
        assert offences(line, ["abc1234" + "0" * 33]) == [], line
    # a digest is only flagged when it is one of the clone's commits
    assert offences(good[1], ["1ba1b9b1c0cb1a5e" + "0" * 24])


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_have_no_history_paths_or_host_names(path):
    found = offences(path.read_text(), commits())
    assert found == [], f"{path.relative_to(ROOT)}:\n" + "\n".join(found)


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_performance_table_is_the_results_json():
    """docs/performance.md's table and bench/results.json cannot disagree, and its rows stay
    short enough to read."""
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "render_results.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = json.loads((ROOT / "bench" / "results.json").read_text())["rows"]
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert {"what", "fluidctl", "peer", "ratio", "command", "date"} <= set(row), row
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", row["date"]), row
        assert row["command"].startswith(("python bench/", "sudo python bench/")), row
    table = [line for line in (ROOT / "docs" / "performance.md").read_text().splitlines()
             if line.startswith("| ")]
    assert len(table) == len(rows) + 1 and max(map(len, table)) <= 300


def test_render_check_fails_when_a_figure_changes(tmp_path, monkeypatch):
    """--check is not a no-op: a figure changed in the json makes it fail."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import render_results
        import results
    finally:
        sys.path.remove(str(ROOT / "bench"))
    data = results.load()
    data["rows"][0]["fluidctl"] = "99.999 s"
    rendered = render_results.render(render_results.DOC.read_text(), data)
    assert "99.999 s" in rendered and rendered != render_results.DOC.read_text()
    fake = tmp_path / "results.json"
    fake.write_text(json.dumps(data))
    monkeypatch.setattr(render_results, "load", lambda: results.load(fake))
    assert render_results.main(["--check"]) == 1
