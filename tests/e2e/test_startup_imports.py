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
    for heavy in ("psutil", "fluidctl.diagnostics.stacks", "concurrent.futures", "secrets", "numpy",
                  "paramiko", "rich", "matplotlib"):
        assert heavy not in mods, f"a clean 'fluidctl train' imported {heavy}"


def test_report_help_loads_no_plotting_library(tmp_path):
    """matplotlib is imported by ``fluidctl report`` only when it draws (read from
    sys.modules after the command: -X importtime's listing stops short under click here)."""
    code = ("import sys\nfrom fluidctl.cli import main\ntry:\n    main(['report', '--help'])\n"
            "except SystemExit:\n    pass\nprint('MODULES', ' '.join(sorted(sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    mods = set(res.stdout.rsplit("MODULES ", 1)[-1].split())
    assert "fluidctl.commands.report" in mods, res.stdout[-2000:] + res.stderr[-2000:]
    for heavy in ("matplotlib", "numpy", "fluidctl.report.plots", "fluidctl.report.facts"):
        assert heavy not in mods, f"'fluidctl report --help' imported {heavy}"


@pytest.mark.parametrize("module, absent", [
    ("fluidctl.node.agent", ("fluidctl.backends.ssh.agent", "fluidctl.backends.ssh.launcher",
                             "fluidctl.diagnostics.watch", "fluidctl.planning.plan", "paramiko",
                             "psutil")),
])
def test_the_node_agent_answers_its_probe_light(tmp_path, module, absent):
    mods = imported([], tmp_path, code=f"import {module}")
    assert module in mods
    for heavy in absent:
        assert heavy not in mods, f"{module} imports {heavy} before its probe"


def test_the_ssh_launcher_leaves_the_supervisor_to_load_while_it_connects(tmp_path):
    """``fluidctl.backends.ssh.launcher`` and ``fluidctl.launch.execute`` (imported before the
    first connection) do not import the supervisor or the diagnostics: those load on a thread
    while the nodes are connected to and probed (``PRELOAD``), and each is named there."""
    from fluidctl.backends.ssh.launcher import PRELOAD
    mods = imported([], tmp_path, code="import fluidctl.backends.ssh.launcher, "
                                        "fluidctl.launch.execute, fluidctl.backends.ssh.fabric")
    assert "fluidctl.backends.ssh.agent" in mods
    for later in ("fluidctl.launch.run", "fluidctl.launch.supervisor",
                  "fluidctl.diagnostics.watch", "fluidctl.backends.ssh.diagnostics"):
        assert later not in mods, f"imported before the first connection: {later}"
    assert {"fluidctl.launch.run", "fluidctl.backends.ssh.diagnostics"} <= set(PRELOAD)


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
    assert "fluidctl.node.worker" in mods
    for heavy in ("click", "fluidctl.planning.plan", "fluidctl.commands.worker", "rich",
                  "dataclasses", "socket", "traceback"):    # ~6, 2 and 2 ms of every rank
        assert heavy not in mods, f"a rank under srun imported {heavy}"


QUICK_PATHS_NEVER_IMPORT = ("re", "typing", "json", "threading", "signal", "enum", "shutil",
                            "subprocess", "click", "dataclasses")


def _bare_imports(argv, cwd) -> set:
    """Modules ``fluidctl ARGV`` imports under ``python -S`` (no site hooks: this sandbox's
    .pth files import re and typing for every process), with this checkout and this
    interpreter's sys.path (site-packages included) set by hand."""
    import fluidctl
    repo = str(__import__("pathlib").Path(fluidctl.__file__).parent.parent)
    path = [repo] + [p for p in sys.path if p]          # this interpreter's, hooks not rerun
    code = (f"import sys; sys.path[:] = {path!r}; "
            f"sys.argv = ['fluidctl', *{[str(a) for a in argv]!r}]; "
            "from fluidctl.cli import main; main()")
    res = subprocess.run([sys.executable, "-S", "-X", "importtime", "-c", code], cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    mods = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}
    return res.returncode, mods, res.stderr


def test_small_shard_data_and_cluster_sync_import_only_what_they_use(tmp_path):
    """Issue 16's start-up: a 1-line shard-data (replacing its output) and a cluster sync
    reach their work without re, typing, json, threading, signal's enums, shutil or
    subprocess (each 1-5 ms in a plain venv; fluidctl's own script does not import re)."""
    data = tmp_path / "one.txt"
    data.write_text("one record\n")
    for _ in range(2):                                  # the second run replaces the output
        code, mods, err = _bare_imports(["shard-data", data, "-n", 1, "-o", tmp_path / "out",
                                         "-q", "--force"], tmp_path)
        assert code == 0, err[-2000:]
    assert "xxhash" in mods and "fluidctl.sharding.engine" in mods      # the run did happen
    assert not mods & set(QUICK_PATHS_NEVER_IMPORT), mods & set(QUICK_PATHS_NEVER_IMPORT)
    config = tmp_path / "ssh_config"
    config.write_text("Host deadnode\n    HostName 127.0.0.1\n    Port 1\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    code, mods, err = _bare_imports(["cluster", "sync", "--hosts", "deadnode", "--ssh-config",
                                     config, "--timeout", 5, tmp_path / "src"], tmp_path)
    assert code == 1 and "failed to sync" in err, err[-2000:]
    assert "fluidctl.remote.push" in mods
    assert not mods & set(QUICK_PATHS_NEVER_IMPORT), mods & set(QUICK_PATHS_NEVER_IMPORT)
