"""The hang watchdog beside CPU hogs (4 busy processes on this machine's cores): a healthy
compute-bound job with --hang-timeout 1 is never stopped (its ranks compute: a verdict needs
two looks that agree, and a rank seen computing in either is not hung), and a hang whose
stack signal wakes the ranks (they leave a C sleep and exit 0) still ends as a hang. Each is
run several times in a row: the defects they guard against showed in 1 of 7 and 1 of 18 runs."""
import json
import os
import subprocess
import sys

import pytest

from launchutil import ROOT

TROUBLE = ROOT / "tests" / "scripts" / "trouble.py"
HOGS = 4
COMPUTE_RUNS = 3                # 30 s of silent computing looked at every second
WOKEN_RUNS = 4

C_SLEEP = ROOT / "tests" / "scripts" / "c_sleep_rank.py"


@pytest.fixture
def cpu_hogs():
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def train(tmp_path, n, *args, env=None):
    log = tmp_path / f"log{n}"
    res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--nproc", "2",
                          "--log-dir", str(log), *map(str, args)], cwd=tmp_path,
                         env={**os.environ, **(env or {})}, capture_output=True, text=True,
                         timeout=180)
    return res, log


def test_40_8_a_compute_bound_job_beside_cpu_hogs_is_never_stopped(tmp_path, cpu_hogs):
    codes = []
    for n in range(COMPUTE_RUNS):
        res, log = train(tmp_path, n, "--hang-timeout", 1, TROUBLE, "compute")
        codes.append(res.returncode)
        assert res.returncode == 0, (codes, res.stderr)
        assert not list(log.glob("hang-*")), res.stderr
        assert "watching on" in (log / "launch.log").read_text()


def test_40_8_a_hang_whose_stack_signal_wakes_the_ranks_ends_as_a_hang(tmp_path, cpu_hogs):
    codes = []
    for n in range(WOKEN_RUNS):
        res, log = train(tmp_path, n, "--hang-timeout", 2, C_SLEEP,
                         env={"FLUIDCTL_PYSPY": ""})     # py-spy off: the faulthandler signal
        codes.append(res.returncode)
        assert res.returncode == 124, (codes, res.stdout, res.stderr)
        assert "the job hung" in res.stderr and "Traceback" not in res.stderr
        assert json.loads((log / "failure.json").read_text())["hang"]
