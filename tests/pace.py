"""Deadlines that scale with how fast this machine is now: a test that gives a job N seconds of
silence before calling it hung measures how long a rank takes to start torch here (twice:
beside CPU hogs or five other test runs it is several times the quiet figure), and waits
that much longer. Measured once per test process."""
import functools
import subprocess
import sys
import time


@functools.lru_cache(maxsize=None)
def torch_start_seconds() -> float:
    """Seconds a new interpreter takes to import torch and torch.distributed, now."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True,
                   capture_output=True, timeout=600)
    return time.monotonic() - started


def hang_timeout(least: float) -> float:
    """A --hang-timeout of at least ``least`` seconds that outlasts a torch rank's start-up
    (two ranks starting at once on a crowded machine take about twice one's time) with room
    to spare."""
    return round(max(least, 2 * torch_start_seconds() + 2), 1)
