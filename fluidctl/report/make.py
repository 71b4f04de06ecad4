"""``fluidctl report``'s work: find the job, read it, draw, write the page (and PNGs).
Outputs go to a temporary name and are renamed into place (``paths.write_atomic``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

from fluidctl.errors import UsageError
from fluidctl.paths import write_atomic

REPORT_NAME = "report.html"         # the default output, in the job's log dir


def make(job: str, output: Optional[str] = None, png_dir: Optional[str] = None) -> Path:
    """Write the report of ``job`` (a log dir or a Slurm job id); returns its path."""
    from fluidctl.report import facts as facts_mod, page, plots
    from fluidctl.report.locate import locate
    layout = locate(job)
    out = Path(output) if output else layout.root / REPORT_NAME
    _writable_dir(out.parent, "-o")
    if png_dir:
        _writable_dir(Path(png_dir), "--png", make=True)
    facts = facts_mod.read(layout)
    figures = plots.all_figures(facts)
    try:
        written: List[Path] = []
        if png_dir:
            for name, _, fig in figures:
                target = Path(png_dir) / f"{name}.png"
                tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp.png")
                plots.png(fig, tmp)
                os.replace(tmp, target)
                written.append(target)
        svgs = {name: plots.svg(fig) for name, _, fig in figures}
    finally:
        plots.close(figures)
    write_atomic(out, page.render(facts, svgs))
    return out


def _writable_dir(where: Path, option: str, make: bool = False) -> None:
    where = where if str(where) else Path(".")
    if make:
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot make {option} directory {where}: {exc.strerror}",
                             f"pass {option} with a writable directory") from None
    if not where.is_dir():
        raise UsageError(f"{option}: {where} is not a directory",
                         f"pass {option} with a path in an existing directory")
    if not os.access(where, os.W_OK):
        raise UsageError(f"{option}: {where} is not writable",
                         f"pass {option} with a path in a writable directory")


def run(job: str, output: Optional[str] = None, png_dir: Optional[str] = None) -> None:
    out = make(job, output, png_dir)
    print(f"report: {out}" + (f" (plots as PNG in {png_dir})" if png_dir else ""), flush=True)
