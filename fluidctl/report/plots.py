"""The report's plots, drawn with matplotlib (the ``report`` extra): the timeline, every
rank's step time, and the straggler heat map (rank x time). Each is a ``Figure`` (no pyplot:
no GUI backend, no global state), saved as SVG to be inlined in the page (text stays text,
fonts are the browser's, a heat map's cells are one embedded PNG) and as PNG for ``--png``.

matplotlib is imported here only: ``fluidctl`` itself starts without it.
"""
from __future__ import annotations

import io
import math
from typing import Dict, List, Sequence, Tuple

from fluidctl.errors import UsageError
from fluidctl.report.facts import Facts

LANES = (  # timeline lane -> (label, marker, colour)
    ("restart", ("restarts", "v", "#d62728")),
    ("preempt", ("preemptions", "X", "#9467bd")),
    ("world", ("elastic worlds", "D", "#1f77b4")),
    ("node_lost", ("lost nodes", "x", "#8c564b")),
    ("checkpoint", ("checkpoints", "s", "#2ca02c")),
    ("straggler", ("stragglers", "o", "#ff7f0e")),
    ("hang", ("hangs", "P", "#e377c2")),
)
ALL_LINES = 64          # ranks drawn one line each; above: a band and the slowest ranks
SLOWEST = 8
HEAT_ROWS = 512         # a heat map's rows at most (ranks folded into bands above)


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("fluidctl report needs matplotlib",
                         "pip install 'fluidctl[report]' (or pip install matplotlib)") from None
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "fluidctl",
                                "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    from matplotlib.figure import Figure
    return Figure


def svg(fig) -> str:
    """The figure as an <svg> element to inline (no XML prolog, no DOCTYPE: nothing to fetch)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "fluidctl report"})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def png(fig, path) -> None:
    fig.savefig(path, format="png", dpi=110)


def _clock(facts: Facts):
    """x for an epoch time: seconds since the job began; and the axis's label."""
    import time
    start = facts.start or 0.0
    label = "seconds since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    return (lambda t: t - start), label


def _span(facts: Facts) -> Tuple[float, float]:
    """Every plot's x range: the job's first to its last thing seen (seconds since start)."""
    times = [m.time for m in facts.marks] + [r["t"] for r in facts.history]
    start = facts.start or 0.0
    return 0.0, max([1.0] + [t - start for t in times]) * 1.02


def _attempt_spans(facts: Facts, end: float) -> List[Tuple[int, float, float, str]]:
    """(attempt, began, ended, how it ended) from the attempt/end marks."""
    spans, open_at = [], {}
    for m in facts.marks:
        if m.kind == "attempt" and m.attempt is not None:
            open_at[m.attempt] = m.time
        elif m.kind == "end" and m.attempt in open_at:
            spans.append((m.attempt, open_at.pop(m.attempt), m.time, m.text))
    for attempt, began in open_at.items():
        spans.append((attempt, began, end, "running"))
    return sorted(spans)


def timeline(facts: Facts):
    Figure = _matplotlib()
    x, label = _clock(facts)
    times = [m.time for m in facts.marks] + [r["t"] for r in facts.history]
    end = max(times) if times else (facts.start or 0.0)
    lanes = [(kind, look) for kind, look in LANES if any(m.kind == kind for m in facts.marks)]
    fig = Figure(figsize=(10, 1.2 + 0.35 * (len(lanes) + 1)), layout="constrained")
    ax = fig.add_subplot()
    names = ["attempts"] + [look[0] for _, look in lanes]
    for attempt, began, ended, how in _attempt_spans(facts, end):
        failed = "failed" in how
        ax.barh(0, max(x(ended) - x(began), 0.05), left=x(began), height=0.5,
                color="#f4a6a6" if failed else "#a6c8f4", edgecolor="#555555",
                gid=f"attempt-{attempt}")
        ax.text(x(began), 0, f" attempt {attempt}", va="center", fontsize=8)
    for row, (kind, (_, marker, colour)) in enumerate(lanes, start=1):
        at = [x(m.time) for m in facts.marks if m.kind == kind]
        ax.scatter(at, [row] * len(at), marker=marker, color=colour, s=40, zorder=3,
                   gid=f"lane-{kind}")
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel(label)
    ax.set_xlim(*_span(facts))
    ax.set_title("timeline")
    return fig


def _series(facts: Facts, column: int) -> Dict[int, Tuple[List[float], List[float]]]:
    """rank -> (x, value) of one column of the step history (1: step, 2: own, 3: data)."""
    x, _ = _clock(facts)
    out: Dict[int, Tuple[List[float], List[float]]] = {}
    for record in facts.history:
        for rank, numbers in record["ranks"].items():
            xs, ys = out.setdefault(int(rank), ([], []))
            xs.append(x(record["t"]))
            ys.append(numbers[column])
    return out


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def step_times(facts: Facts):
    """Two panels over time: each rank's time per collective (waiting included), and its
    own part (compute and data): the straggler's own time stands out, the others' waiting."""
    Figure = _matplotlib()
    _, label = _clock(facts)
    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, column, name, title in (
            (top, 1, "step", "time per collective, waiting included (ms)"),
            (bottom, 2, "own", "own time per collective: compute and data (ms)")):
        series = _series(facts, column)
        _lines(ax, series, _series(facts, 2), name)
        ax.set_ylabel("ms")
        ax.set_title(title)
        for m in facts.marks:
            if m.kind in ("restart", "world", "preempt"):
                ax.axvline(m.time - (facts.start or 0.0), color="#d62728", lw=0.8, ls="--")
    bottom.set_xlabel(label)
    bottom.set_xlim(*_span(facts))
    return fig


def _lines(ax, series, own, name: str) -> None:
    """One line per rank (its SVG group's id: NAME-rank-RANK), or, for many ranks, the
    spread of all and a line for each of the slowest."""
    ranks = sorted(series)
    if len(ranks) <= ALL_LINES:
        for rank in ranks:
            xs, ys = series[rank]
            ax.plot(xs, ys, lw=1, marker="." if len(xs) < 3 else None, label=f"rank {rank}",
                    gid=f"{name}-rank-{rank}")
        if ranks:
            ax.legend(fontsize=7, ncol=max(1, math.ceil(len(ranks) / 12)), loc="upper left")
        return
    slowest = sorted(ranks, key=lambda r: -_median(own.get(r, ([], []))[1]))[:SLOWEST]
    by_x: Dict[float, List[float]] = {}
    for rank in ranks:
        for xv, yv in zip(*series[rank]):
            by_x.setdefault(xv, []).append(yv)
    xs = sorted(by_x)
    pct = [(sorted(by_x[v])[len(by_x[v]) // 10], _median(by_x[v]),
            sorted(by_x[v])[len(by_x[v]) * 9 // 10]) for v in xs]
    ax.fill_between(xs, [p[0] for p in pct], [p[2] for p in pct], color="#cccccc",
                    label="ranks p10-p90")
    ax.plot(xs, [p[1] for p in pct], color="#555555", lw=1, label="median")
    for rank in slowest:
        ax.plot(*series[rank], lw=1, label=f"rank {rank}", gid=f"{name}-rank-{rank}")
    ax.legend(fontsize=7, loc="upper left")


def heat_map(facts: Facts):
    """Each rank's own time per collective (ms), rank x time: a straggler is a hot row."""
    Figure = _matplotlib()
    import numpy as np
    x, label = _clock(facts)
    ranks = facts.ranks
    records = facts.history
    fig = Figure(figsize=(10, 1.5 + min(6.0, 0.18 * len(ranks))), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("straggler heat map: own time per collective (ms), rank x time")
    if not records or not ranks:
        ax.text(0.5, 0.5, "no step history yet", ha="center", va="center",
                transform=ax.transAxes)
        return fig
    row_of = {r: i for i, r in enumerate(ranks)}
    grid = np.full((len(ranks), len(records)), np.nan)
    for j, record in enumerate(records):
        for rank, numbers in record["ranks"].items():
            grid[row_of[int(rank)], j] = numbers[2]
    rows = _fold(grid, len(ranks))
    edges = [x(records[0]["t"] - records[0].get("dt", 1.0))] + [x(r["t"]) for r in records]
    for i in range(1, len(edges)):              # a gap (a restart) never inverts a cell
        edges[i] = max(edges[i], edges[i - 1] + 1e-3)
    import matplotlib
    cmap = matplotlib.colormaps["inferno"].with_extremes(bad="#eeeeee")
    mesh = ax.pcolormesh(edges, np.arange(rows.shape[0] + 1) - 0.5, rows, cmap=cmap,
                         rasterized=True, shading="flat")
    fig.colorbar(mesh, ax=ax, label="ms")
    ax.grid(False)
    step = len(ranks) / rows.shape[0]
    ticks = list(range(rows.shape[0]))[:: max(1, rows.shape[0] // 16)]
    ax.set_yticks(ticks, [str(ranks[int(t * step)]) for t in ticks])
    ax.set_ylim(rows.shape[0] - 0.5, -0.5)
    ax.set_xlim(*_span(facts))
    ax.set_ylabel("rank" if step == 1 else f"rank (bands of {step:.0f}, the slowest shown)")
    ax.set_xlabel(label)
    return fig


def _fold(grid, n: int):
    """At most HEAT_ROWS rows: bands of neighbouring ranks, each its slowest."""
    import numpy as np
    if n <= HEAT_ROWS:
        return grid
    bands = np.array_split(np.arange(n), HEAT_ROWS)
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.vstack([np.nanmax(grid[b], axis=0) for b in bands])


def all_figures(facts: Facts) -> List[Tuple[str, str, object]]:
    """(name, title, Figure) of every plot, in the page's order."""
    return [("timeline", "Timeline", timeline(facts)),
            ("step-times", "Step time per rank", step_times(facts)),
            ("heat-map", "Straggler heat map", heat_map(facts))]


def close(figures) -> None:
    """Free the figures' artists (no pyplot: nothing else holds them)."""
    for _, _, fig in figures:
        fig.clear()
