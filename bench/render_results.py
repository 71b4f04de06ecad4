"""Render bench/results.json into docs/performance.md's table (between its results markers).

    python bench/render_results.py           # rewrite the table
    python bench/render_results.py --check   # exit 1 if the table and the json disagree
"""
import argparse
import re
import sys
from pathlib import Path

from results import load

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- results: begin (bench/render_results.py) -->", "<!-- results: end -->"


def table(data: dict) -> str:
    lines = ["| what | fluidctl | peer | ratio | command | date |", "|---|---|---|---|---|---|"]
    notes = []
    for row in data["rows"]:
        what = row["what"]
        if row.get("note"):
            notes.append(row["note"])
            what += f" ({len(notes)})"
        lines.append(f"| {what} | {row['fluidctl']} | {row['peer']} | {row['ratio']} "
                     f"| `{row['command']}` | {row['date']} |")
    lines.append("")
    lines += [f"({i}) {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines)


def render(text: str, data: dict) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: {DOC} has no results markers ({BEGIN} ... {END})")
    return pattern.sub(lambda _: f"{BEGIN}\n{table(data)}\n{END}", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = ap.parse_args(argv)
    text = DOC.read_text()
    new = render(text, load())
    if args.check:
        if new != text:
            print(f"{DOC.relative_to(ROOT)} differs from bench/results.json: "
                  "run python bench/render_results.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
