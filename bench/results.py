"""bench/results.json: the one place benchmark figures live. docs/performance.md's table is
rendered from it (bench/render_results.py), so the docs cannot disagree with what a bench
measured. A bench run with --record updates its row here: its figures, command and date."""
import datetime
import json
import subprocess
from pathlib import Path

PATH = Path(__file__).with_name("results.json")
FIELDS = ("what", "fluidctl", "peer", "ratio", "command", "date")


def load(path=PATH) -> dict:
    return json.loads(Path(path).read_text())


def record(row_id: str, path=PATH, **fields) -> dict:
    """Set row ``row_id``'s fields (fluidctl=..., peer=..., ratio=..., command=...), stamped with
    today's date and the checkout's commit (a new id is appended), and render the table."""
    data = load(path)
    row = next((r for r in data["rows"] if r["id"] == row_id), None)
    if row is None:
        row = {"id": row_id}
        data["rows"].append(row)
    row.update(fields)
    row["date"] = datetime.date.today().isoformat()
    try:
        row["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PATH.parent,
                                       capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        row.pop("commit", None)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    if Path(path) == PATH:                 # and the table that shows it
        import render_results
        render_results.main([])
    return row
