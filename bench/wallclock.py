"""Shared by the start-up benchmarks: time whole commands, interleave the contenders round by
round (so machine noise hits them alike), and print medians."""
import statistics
import subprocess
import time
from typing import Callable, Dict, List


def timed(cmd, cwd, env=None) -> float:
    """Seconds one command takes; a failing command stops the benchmark with its stderr."""
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    if res.returncode:
        raise SystemExit(f"{cmd[0]} failed: {res.stderr[-2000:]}")
    return time.perf_counter() - start


def interleaved(runners: Dict[str, Callable[[], float]], repeat: int) -> Dict[str, List[float]]:
    times = {name: [] for name in runners}
    for _ in range(repeat):
        for name, run in runners.items():
            times[name].append(run())
    return times


def report(title: str, times: Dict[str, List[float]]) -> Dict[str, float]:
    """Print median/min/max per contender; return the medians."""
    med = {name: statistics.median(t) for name, t in times.items()}
    width = max(len(name) for name in times) + 2
    print(title)
    print(f"{'launcher':<{width}} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, t in times.items():
        print(f"{name:<{width}} {med[name]:>9.3f} {min(t):>7.3f} {max(t):>7.3f}")
    return med
