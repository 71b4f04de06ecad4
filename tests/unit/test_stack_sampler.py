"""The hang watchdog's samples of ranks without progress counters (an unmodified torch script):
CPU time used counts as progress with or without py-spy, so a rank still importing torch on a
crowded machine is no hang, while a rank asleep in a wait stays the same sample after sample."""
import subprocess
import sys
import time

import pytest

from fluidctl.diagnostics.watch import StackSampler, Target

COMPUTES = "print(flush=True)\nwhile True: pass"
WAITS = "import time; print(flush=True); time.sleep(600)"


@pytest.fixture
def ranks():
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
             for code in (COMPUTES, WAITS)]
    for p in procs:             # started: the sleeper's own start-up is over
        p.stdout.readline()
    yield [Target(rank, p.pid, "127.0.0.1", f"trainer {rank}") for rank, p in enumerate(procs)]
    for p in procs:
        p.kill()
        p.wait(timeout=30)
        p.stdout.close()


def distinct_samples(sampler: StackSampler, want: int, deadline: float = 60.0) -> list:
    """The sampler's ``seen`` each time it changes, until ``want`` have been seen."""
    seen, end = [], time.monotonic() + deadline
    while len(seen) < want and time.monotonic() < end:
        now = sampler(())
        if now and (not seen or now != seen[-1]):
            seen.append(now)
        time.sleep(0.02)        # polling the sampler's latest value, as the watchdog does
    return seen


@pytest.mark.parametrize("pyspy", ["", "/nonexistent/py-spy"], ids=["off", "missing"])
def test_cpu_time_is_progress_without_pyspy(ranks, monkeypatch, pyspy):
    monkeypatch.setenv("FLUIDCTL_PYSPY", pyspy)
    sampler = StackSampler(lambda: ranks, every=0.1)
    try:
        seen = distinct_samples(sampler, 3)
    finally:
        sampler.stop()
    assert len(seen) == 3, f"the sampler stopped moving without py-spy: {seen}"
    assert all({rank for rank, _ in s} == {0} for s in seen), seen   # the sleeper: never
