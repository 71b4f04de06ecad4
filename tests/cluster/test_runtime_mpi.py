"""Under a plain ``mpirun python train.py`` (OMPI_* only, no PADDLE_*): rank 0 picks the store
port and broadcasts it with mpi4py, and collectives run on MPI's communicator."""
import os
import shutil
import subprocess
import sys

import pytest

import rankspawn

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.usefixtures("openmpi")


def mpirun(scenario, n=2):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PADDLE_", "FLUIDCTL_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = rankspawn.ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TEST_TIMEOUT"] = "20"
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                           sys.executable, "-u", "tests/runtime_worker.py", scenario],
                          env=env, cwd=rankspawn.ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert len(lines) == n, proc.stdout + proc.stderr
    return rankspawn.results(rankspawn.Result([0], [proc.stdout]))[0], lines


def test_collectives_over_mpi():
    result, _ = mpirun("ops")
    assert result.pop("transport") == "mpi"
    result.pop("shm_direct")
    result.pop("shm_native")
    assert [k for k, ok in result.items() if ok is not True] == []


def test_bad_input_over_mpi_is_the_same_error_everywhere():
    _, lines = mpirun("errors")
    assert lines[0] == lines[1]
    assert "shape mismatch: rank 0 passed shape (3,), rank 1 shape (4,)" in lines[0]
