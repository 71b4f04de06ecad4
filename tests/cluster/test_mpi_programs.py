"""MPI's own programs keep mpirun's world on every launch path (issue 15).

The same mpi4py programs (hello world, a token ring, a barrier + ping-pong that insist on two
processes, a reduce of pi: tests/scripts/mpi_shapes.py) run under ``mpirun python``, ``mpirun
fluidctl worker`` and ``fluidctl train --backend mpi``, on one node and over the two loopback
sshd nodes; every path must compute exactly what plain mpirun computes, and the fluidctl paths
must also hand the script the PADDLE_* contract.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fluidctl.backends import mpi
from fluidctl.planning.hosts import parse_hosts_arg
from launchutil import ROOT, fluidctl

MPIRUN = mpi.find_mpirun()
FLUIDCTL = str(Path(sys.executable).parent / "fluidctl")
SHAPES_PY = str(ROOT / "tests" / "scripts" / "mpi_shapes.py")
SHAPES = ["hello", "ring", "pingpong", "pi"]
pytestmark = [pytest.mark.usefixtures("openmpi"),
              pytest.importorskip("mpi4py") and pytest.mark.timeout(240)]


def results(outdir: Path, nproc: int):
    return {shape: [json.loads((outdir / f"{shape}.{r}.json").read_text())
                    for r in range(nproc)] for shape in SHAPES}


def contract(outdir: Path, nproc: int):
    return [json.loads((outdir / f"contract.{r}.json").read_text()) for r in range(nproc)]


def mpirun(argv, nproc, outdir, extra=()):
    outdir.mkdir()
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(nproc), *extra, *argv,
           SHAPES_PY, str(outdir), *SHAPES]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_one_node_every_path_sees_the_same_world(tmp_path):
    nproc = 3
    plain = mpirun([sys.executable], nproc, tmp_path / "plain")
    expected = results(tmp_path / "plain", nproc)
    assert [r["size"] for r in expected["hello"]] == [3, 3, 3]
    assert expected["ring"][0]["token"] == 0 + 1 + 2
    assert abs(expected["pi"][0]["pi"] - 3.141592653589793) < 1e-8
    assert "I am process 2 of 3" in plain.stdout

    worker = mpirun([FLUIDCTL, "worker"], nproc, tmp_path / "worker")
    assert results(tmp_path / "worker", nproc) == expected
    assert "I am process 2 of 3" in worker.stdout

    (tmp_path / "train").mkdir()
    res = fluidctl("train", "--backend", "mpi", "--nproc", nproc, SHAPES_PY,
                   tmp_path / "train", *SHAPES, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert results(tmp_path / "train", nproc) == expected
    assert "I am process 0 of 3" in (tmp_path / "mylog" / "workerlog.0").read_text()
    assert "I am process 2 of 3" in (tmp_path / "mylog" / "workerlog.2").read_text()

    # and the fluidctl paths hand over the contract on top of the world
    for path in ("worker", "train"):
        got = contract(tmp_path / path, nproc)
        assert [c["PADDLE_TRAINER_ID"] for c in got] == ["0", "1", "2"]
        assert {c["PADDLE_TRAINERS_NUM"] for c in got} == {"3"}
        assert len(got[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")) == 3
        # fluidctl.runtime.init() works in the same process, beside MPI
        assert [c["runtime"] for c in got] == [[r, 3, [6.0] * 4] for r in range(3)]
    assert contract(tmp_path / "plain", nproc)[0]["PADDLE_TRAINER_ID"] is None


def test_programs_that_insist_on_two_processes_run_under_the_worker(tmp_path):
    """What OSU's benchmarks do: refuse a world of one. Before the fix they failed here."""
    mpirun([FLUIDCTL, "worker"], 2, tmp_path / "out")
    got = results(tmp_path / "out", 2)
    assert [r["iterations"] for r in got["pingpong"]] == [100, 100]
    assert got["pingpong"][0]["last"] == 100 % 256


def test_an_mpi_program_that_cannot_keep_the_world_is_refused(tmp_path):
    """A compiled MPI program cannot share the worker's world: one line, exit 2, not a world
    of one. (A fake ELF that names libmpi stands for it: the refusal reads the file only.)"""
    prog = tmp_path / "osu_latency"
    prog.write_bytes(b"\x7fELF" + b"\0" * 60 + b"libmpi.so.40\0")
    prog.chmod(0o755)
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "-np", "2", FLUIDCTL, "worker",
                           str(prog)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "is an MPI program" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


def test_two_ssh_nodes_every_path_sees_the_same_world(sshd_nodes, tmp_path):
    """Two "nodes" that are one host: Open MPI 5 needs its TCP transport (btl tcp,self: the
    shared-memory one collides between the two daemons) and its HAN collectives off (with HAN,
    MPI_Barrier across the 127.0.0.2/.3 aliases hangs even under plain ``mpirun python``). A
    real cluster needs neither; see README."""
    hosts = list(parse_hosts_arg("node1:2,node2:2"))
    hostfile = mpi.write_hostfile(hosts, tmp_path / "hostfile")

    def over_ssh(argv, name):
        out = tmp_path / name
        out.mkdir()
        cmd = mpi.command([*argv, SHAPES_PY, str(out), *SHAPES], 4, hosts=hosts,
                          hostfile=str(hostfile), ssh_config=str(sshd_nodes.config),
                          env_names=mpi.export_names({}), extra=["--mca", "btl", "tcp,self", "--mca", "coll", "^han"])
        proc = subprocess.run(cmd, env=mpi.environment({}), capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return results(out, 4)

    expected = over_ssh([sys.executable], "plain")
    assert [r["size"] for r in expected["hello"]] == [4] * 4
    assert over_ssh([sys.executable, "-m", "fluidctl", "worker"], "worker") == expected
    eps = contract(tmp_path / "worker", 4)[3]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert [e.rsplit(":", 1)[0] for e in eps] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2

    (tmp_path / "train").mkdir()
    res = fluidctl("train", "--backend", "mpi", "--hostfile", sshd_nodes.hostfile("h", slots=2),
                   "--ssh-config", sshd_nodes.config, SHAPES_PY, tmp_path / "train", *SHAPES,
                   cwd=tmp_path, timeout=180, env={"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_coll": "^han"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert results(tmp_path / "train", 4) == expected
