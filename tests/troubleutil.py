"""tests/scripts/trouble.py (a training script that hangs, raises or idles on demand) and the
lines the diagnostics must name in it: shared by the one-node and the many-node diagnostics tests."""
import re
from datetime import datetime
from pathlib import Path

from launchutil import ROOT

TROUBLE = str(ROOT / "tests" / "scripts" / "trouble.py")


def line_of(code: str) -> int:
    """The line of trouble.py holding ``code`` (exactly once)."""
    (n,) = [i for i, l in enumerate(Path(TROUBLE).read_text().splitlines(), 1) if code in l]
    return n


STUCK = line_of("    ctx.allreduce(x)  # stuck")
LOADER = line_of("time.sleep(3600)")
RAISE = line_of("raise ValueError")
IDLE = line_of("time.sleep(0.5)")


def hang_dir(log_dir: Path) -> Path:
    (found,) = list(log_dir.glob("hang-*"))
    return found


def hang_stamps(log: Path) -> dict:
    """When (epoch seconds, from launch.log, to the second) the watchdog found the hang
    ("found") and printed its classified sentence ("classified")."""
    stamps = {}
    for line in (log / "launch.log").read_text().splitlines():
        m = re.match(r"(\S+ \S+) hang: (no rank wrote|\w[\w ]*: )", line)
        if m:
            key = "found" if m.group(2) == "no rank wrote" else "classified"
            stamps[key] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    return stamps


def classified_after(log: Path) -> float:
    """Seconds between the watchdog's finding and the classified sentence in launch.log."""
    stamps = hang_stamps(log)
    return stamps["classified"] - stamps["found"]
