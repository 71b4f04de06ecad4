"""The report as one HTML page with everything inlined (styles, plots as <svg>): it opens from a
file, offline, and can be mailed or attached to an issue. Text comes from the job's own files
and is escaped; nothing on the page refers to anything outside it."""
from __future__ import annotations

import html
import time
from typing import Dict, Iterable, List, Optional, Sequence

from fluidctl.report.facts import Facts

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}
.ok{color:#2a7a2a}.bad{color:#b22}.run{color:#a60}.plot svg{max-width:100%;height:auto}
.dim{color:#777}
"""
MAX_ROWS = 1024         # rows of a table (ranks, events, processes) before '... and N more'


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _clock(epoch: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def _table(head: Sequence[str], rows: Iterable[Sequence], table_id: str,
           row_ids: Optional[Sequence[str]] = None, row_classes: Optional[Sequence[str]] = None
           ) -> str:
    rows = list(rows)
    out = [f'<table id="{table_id}"><thead><tr>'
           + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows[:MAX_ROWS]):
        rid = f' id="{_e(row_ids[i])}"' if row_ids else ""
        cls = f' class="{_e(row_classes[i])}"' if row_classes else ""
        out.append(f"<tr{rid}{cls}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="dim">... and {len(rows) - MAX_ROWS} more</p>')
    return "".join(out)


def _pct(values: List[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f}"


def _state(facts: Facts) -> str:
    if facts.running:
        return '<span class="run">running (the report shows the job so far)</span>'
    if facts.exit_code is None:
        return ('<span class="run">no end recorded (still running, or its launcher was '
                "killed)</span>")
    cls = "ok" if facts.exit_code == 0 else "bad"
    return f'<span class="{cls}">ended with exit code {facts.exit_code}</span>'


def header(facts: Facts) -> str:
    plan = facts.plan
    ends = [m.time for m in facts.marks] + [r["t"] for r in facts.history]
    rows = [("log dir", str(facts.root)), ("backend", plan.backend or "-"),
            ("trainers", plan.trainers or len(facts.ranks)), ("nodes", plan.nodes or "-"),
            ("mode", plan.mode or "-"), ("began", _clock(facts.start)),
            ("last seen", _clock(max(ends) if ends else None))]
    return (f"<h1>fluidctl report: {_e(facts.root.name)}</h1><p id=\"state\">{_state(facts)}</p>"
            + _table(("", ""), rows, "summary"))


def timeline_table(facts: Facts) -> str:
    start = facts.start or 0.0
    marks = facts.marks
    return _table(("time", "+s", "what", "attempt"),
                  [(_clock(m.time), f"{m.time - start:.1f}", m.text,
                    "" if m.attempt is None else m.attempt) for m in marks],
                  "timeline-events", row_classes=[f"event event-{m.kind}" for m in marks])


def ranks_table(facts: Facts) -> str:
    """One row per rank: its host and its step and own times over the job (ms)."""
    steps: Dict[int, List[float]] = {}
    own: Dict[int, List[float]] = {}
    data: Dict[int, List[float]] = {}
    done: Dict[int, int] = {}
    for record in facts.history:
        for rank, numbers in record["ranks"].items():
            r = int(rank)
            done[r] = done.get(r, 0) + int(numbers[0])
            steps.setdefault(r, []).append(numbers[1])
            own.setdefault(r, []).append(numbers[2])
            data.setdefault(r, []).append(numbers[3])
    slow: Dict[int, int] = {}
    for m in facts.marks:
        if m.kind == "straggler":
            for r in m.ranks:
                slow[r] = slow.get(r, 0) + 1
    hosts, ranks = facts.hosts, facts.ranks
    rows = [(r, hosts.get(r, "-"), done.get(r, 0), _pct(steps.get(r, []), 0.5),
             _pct(steps.get(r, []), 0.99), _pct(own.get(r, []), 0.5),
             _pct(data.get(r, []), 0.5), slow.get(r, 0) or "") for r in ranks]
    return _table(("rank", "host", "collectives", "step p50 ms", "step p99 ms", "own p50 ms",
                   "data p50 ms", "straggler verdicts"), rows, "ranks",
                  row_ids=[f"rank-row-{r}" for r in ranks],
                  row_classes=["rank" + (" bad" if r in slow else "") for r in ranks])


def failure_section(facts: Facts) -> str:
    out = []
    failure = facts.failure or {}
    first = failure.get("first_failure")
    if isinstance(first, dict):
        since = first.get("seconds_since_start")
        out.append(f'<p class="bad" id="first-failure">{_e(first.get("label"))} failed on '
                   f'{_e(first.get("host"))}: {_e(first.get("reason"))} (at '
                   f'{_e(_clock(first.get("when")))}'
                   + (f", {since}s after start" if since is not None else "") + ")</p>")
        if first.get("explanation"):
            out.append(f"<p>why: {_e(first['explanation'])}</p>")
        if first.get("log"):
            out.append(f"<p>log: <code>{_e(first['log'])}</code></p>")
        tail = first.get("log_tail") or []
        if tail:
            out.append("<pre>" + _e("\n".join(map(str, tail))) + "</pre>")
    procs = failure.get("processes")
    if isinstance(procs, list) and procs:
        out.append(_table(("process", "host", "pid", "end"),
                          [(p.get("label"), p.get("host"), p.get("pid"), p.get("state"))
                           for p in procs if isinstance(p, dict)], "processes"))
    hang = failure.get("hang")
    if isinstance(hang, dict):
        out.append(f'<p class="bad" id="hang">hang: {_e(hang.get("sentence") or hang.get("why"))}'
                   "</p>")
        if hang.get("summary"):
            out.append("<pre>" + _e("\n".join(map(str, hang["summary"]))) + "</pre>")
    for name, summary in facts.hangs:
        out.append(f"<h3>{_e(name)}/summary.txt</h3><pre>{_e(summary)}</pre>")
    if not out:
        out.append('<p class="ok">no failure and no hang '
                   + ("so far" if facts.running or facts.exit_code is None else "recorded")
                   + "</p>")
    return "".join(out)


def plan_section(facts: Facts) -> str:
    plan = facts.plan
    out = []
    if plan.backend:
        out.append(f"<p>{plan.trainers} trainer(s) on {plan.nodes} node(s) over "
                   f"<b>{_e(plan.backend)}</b>, {_e(plan.mode)} mode, master "
                   f"<code>{_e(plan.master)}</code></p><p>command: <code>{_e(plan.argv)}</code>"
                   "</p>")
    if plan.procs:
        out.append(_table(("role", "rank", "host", "endpoint"), plan.procs, "plan"))
    return "".join(out) or '<p class="dim">no plan recorded (no launch.log)</p>'


def render(facts: Facts, plots: Dict[str, str]) -> str:
    """The page; ``plots``: name -> inline <svg>."""
    def plot(name: str) -> str:
        return f'<div class="plot" id="plot-{name}">{plots.get(name, "")}</div>'

    history = "" if facts.history else (
        '<p class="dim">no step history: the job wrote no steptimes.jsonl (its ranks do not '
        "report step times, or it ran for less than a second)</p>")
    body = [header(facts),
            "<h2>Timeline</h2>", plot("timeline"), timeline_table(facts),
            "<h2>Step time per rank</h2>", history, plot("step-times"), ranks_table(facts),
            "<h2>Straggler heat map</h2>", plot("heat-map"),
            "<h2>Failure or hang</h2>", failure_section(facts),
            "<h2>Plan</h2>", plan_section(facts),
            f'<p class="dim">made by fluidctl report at {_e(_clock(time.time()))}</p>']
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>fluidctl report: {_e(facts.root.name)}</title><style>{STYLE}</style>"
            "</head><body>" + "\n".join(body) + "</body></html>\n")
