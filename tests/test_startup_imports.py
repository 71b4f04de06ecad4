"""What the hot commands import, read from ``python -X importtime``: a guard on the start-up
work of issue 16 and session 3 (each module named here cost milliseconds on every run)."""
import subprocess
import sys

import pytest


def imported(args, cwd, code=None) -> set:
    """Modules the command imports beyond what this interpreter loads for ``pass`` (site and
    .pth files differ between machines)."""
    return _modules(args, cwd, code) - _modules([], cwd, "pass")


def _modules(args, cwd, code=None) -> set:
    argv = [sys.executable, "-X", "importtime"] + (["-c", code] if code else
                                                   ["-m", "fluidctl", *map(str, args)])
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_shard_data_loads_neither_numpy_nor_the_runtime(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("".join(f"record {i}\n" for i in range(1000)))
    mods = imported(["shard-data", data, "-n", 2, "-o", tmp_path / "out", "-q"], tmp_path)
    assert "fluidctl.sharding.engine" in mods and "xxhash" in mods      # the run did happen
    for heavy in ("numpy", "fluidctl.runtime", "rich", "psutil", "concurrent.futures",
                  "dataclasses", "click"):       # click: its plain form goes by fastargs
        assert heavy not in mods, f"shard-data imported {heavy}"


def test_a_clean_local_launch_skips_what_only_failures_need(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    mods = imported(["train", "--nproc", 2, script], tmp_path)
    assert "fluidctl.launch.supervisor" in mods
    for heavy in ("psutil", "fluidctl.stacks", "concurrent.futures", "secrets", "numpy",
                  "paramiko", "rich"):
        assert heavy not in mods, f"a clean 'fluidctl train' imported {heavy}"


@pytest.mark.parametrize("module, absent", [
    ("fluidctl.launch.agent", ("fluidctl.backends.agent", "fluidctl.diagnose",
                               "fluidctl.planning.plan", "paramiko", "psutil")),
])
def test_the_node_agent_answers_its_probe_light(tmp_path, module, absent):
    mods = imported([], tmp_path, code=f"import {module}")
    assert module in mods
    for heavy in absent:
        assert heavy not in mods, f"{module} imports {heavy} before its probe"


def test_a_rank_under_srun_starts_without_click(tmp_path):
    """``python -m fluidctl worker SCRIPT``, as every task of an srun step runs it (here with
    the variables srun gives a task): the script runs in this process, and neither click (half
    of a rank's start-up) nor the planner is imported for it."""
    import os
    script = tmp_path / "noop.py"
    script.write_text("print('ran', flush=True)\n")
    env = dict(os.environ, SLURM_JOB_ID="5", SLURM_STEP_ID="0", SLURM_PROCID="1",
               SLURM_LOCALID="1", SLURM_NODEID="0", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
               SLURM_JOB_NUM_NODES="1", SLURM_STEP_NODELIST="127.0.0.2",
               SLURM_JOB_NODELIST="127.0.0.2", SLURM_STEP_TASKS_PER_NODE="2",
               SLURM_TASKS_PER_NODE="2", SLURMD_NODENAME="127.0.0.2",
               FLUIDCTL_WORKER_ECHO="0", FLUIDCTL_LOG_DIR=str(tmp_path / "log"))
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "fluidctl", "worker",
                          str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    log = (tmp_path / "log" / "workerlog.1").read_text()     # its stderr too, after start-up
    assert log.splitlines()[-1] == "ran"
    mods = {line.rsplit("|", 1)[1].strip() for line in (res.stderr + log).splitlines()
            if line.startswith("import time:") and "|" in line} - _modules([], tmp_path, "pass")
    assert "fluidctl.commands.worker_run" in mods
    for heavy in ("click", "fluidctl.planning.plan", "fluidctl.commands.worker", "rich",
                  "dataclasses", "socket", "traceback"):    # ~6, 2 and 2 ms of every rank
        assert heavy not in mods, f"a rank under srun imported {heavy}"
