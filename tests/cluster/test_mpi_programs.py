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

from fluidctl.backends.mpi import launcher as mpi
from fluidctl.planning.hosts import parse_hosts_arg
from launchutil import ONE_HOST_MPI_ENV, ROOT, fluidctl

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


def run_mpirun(cmd, **kw):
    """A plain mpirun, started again (at most twice, AGAIN_PAUSE seconds later, stale session
    directories swept) when it died of a signal having said nothing, or when a node's daemon
    failed at its start: Open MPI 5.0.11's mpirun has done both right after its start in full
    suite runs, once twice a second apart (fluidctl's own --backend mpi does the same,
    backends/mpi/launcher.py MpirunProcess)."""
    import time
    from fluidctl.backends.mpi.launcher import AGAIN_PAUSE, DAEMON_FAILED, STARTS_AGAIN
    from fluidctl.procs import mpisessions
    for _ in range(STARTS_AGAIN):
        proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
        if not ((proc.returncode < 0 and not proc.stdout and not proc.stderr) or
                (proc.returncode != 0 and DAEMON_FAILED in proc.stdout + proc.stderr)):
            return proc
        mpisessions.sweep()
        time.sleep(AGAIN_PAUSE)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def mpirun(argv, nproc, outdir, extra=()):
    outdir.mkdir()
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(nproc), *extra, *argv,
           SHAPES_PY, str(outdir), *SHAPES]
    proc = run_mpirun(cmd, timeout=180)
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
        # and its rendezvous is one join for the node, served by the node's lowest rank
        assert all(c["through_node"] for c in got) and got[0]["joins"] == 1
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
    """Two "nodes" that are one host, so Open MPI runs with ONE_HOST_MPI_ENV (tests/launchutil.py
    says why); a real cluster needs none of it."""
    hosts = list(parse_hosts_arg("node1:2,node2:2"))
    hostfile = mpi.write_hostfile(hosts, tmp_path / "hostfile")

    def over_ssh(argv, name):
        out = tmp_path / name
        out.mkdir()
        cmd = mpi.command([*argv, SHAPES_PY, str(out), *SHAPES], 4, hosts=hosts,
                          hostfile=str(hostfile), ssh_config=str(sshd_nodes.config),
                          env_names=mpi.export_names({}))
        proc = run_mpirun(cmd, env=mpi.environment(ONE_HOST_MPI_ENV), timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return results(out, 4)

    expected = over_ssh([sys.executable], "plain")
    assert [r["size"] for r in expected["hello"]] == [4] * 4
    assert over_ssh([sys.executable, "-m", "fluidctl", "worker"], "worker") == expected
    got = contract(tmp_path / "worker", 4)
    eps = got[3]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert [e.rsplit(":", 1)[0] for e in eps] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2
    # each node's lowest rank joins rank 0's store for its node: two joins, not four
    assert [c["runtime"][2] for c in got] == [[10.0] * 4] * 4
    assert all(c["through_node"] for c in got) and got[0]["joins"] == 2

    (tmp_path / "train").mkdir()
    res = fluidctl("train", "--backend", "mpi", "--hostfile", sshd_nodes.hostfile("h", slots=2),
                   "--ssh-config", sshd_nodes.config, SHAPES_PY, tmp_path / "train", *SHAPES,
                   cwd=tmp_path, timeout=180, env=ONE_HOST_MPI_ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert results(tmp_path / "train", 4) == expected


# --- issue 25.16 and 25.14: mpirun options, stderr, stdin, spawned ranks -------------------
def train(tmp_path, *args, stdin=None, timeout=120):
    env = dict(__import__("os").environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "fluidctl", "train", "--backend", "mpi",
                           *map(str, args)], cwd=tmp_path, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


STREAMS = """
import os, sys
from mpi4py import MPI
print(f"out {MPI.COMM_WORLD.rank} {os.environ.get('MY_SETTING')}", flush=True)
print(f"warning from {MPI.COMM_WORLD.rank}", file=sys.stderr, flush=True)
"""


def test_mpirun_arg_is_passed_and_rank_stderr_stays_on_stderr(tmp_path):
    """--mpirun-arg reaches mpirun as it is (repeatable, shown by --dry-run); the ranks'
    stderr is echoed on fluidctl's stderr, so 2>/dev/null hides it as under plain mpirun."""
    script = tmp_path / "streams.py"
    script.write_text(STREAMS)
    dry = train(tmp_path, "--nproc", 2, "--mpirun-arg=-x MY_SETTING=42",
                "--mpirun-arg=--mca", "--mpirun-arg=btl self,tcp", "--dry-run", script)
    assert dry.returncode == 0, dry.stderr
    assert " --oversubscribe -x MY_SETTING=42 --mca btl self,tcp -x " in dry.stdout, dry.stdout
    for tee in ("rank0", "all"):
        res = train(tmp_path, "--nproc", 2, "--tee", tee, "--mpirun-arg=-x MY_SETTING=42",
                    script)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "out 0 42" in res.stdout and "warning from 0" in res.stderr, (tee, res)
        assert "warning" not in res.stdout, (tee, res.stdout)
    both = (tmp_path / "mylog" / "workerlog.0").read_text()
    assert "out 0 42" in both and "warning from 0" in both     # the log keeps both streams
    bad = fluidctl("train", "--nproc", 2, "--mpirun-arg=--oversubscribe", script, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --mpirun-arg is an MPI "
                                                         "option (add --backend mpi)"), bad.stderr


PI_FROM_STDIN = """
from mpi4py import MPI
comm = MPI.COMM_WORLD
n = int(input("intervals? ")) if comm.rank == 0 else None
n = comm.bcast(n, root=0)
h = 1.0 / n
part = sum(4.0 / (1.0 + ((i + 0.5) * h) ** 2) for i in range(comm.rank, n, comm.size)) * h
pi = comm.reduce(part, op=MPI.SUM, root=0)
if comm.rank == 0:
    print(f"pi {pi:.6f}", flush=True)
"""


def test_standard_input_reaches_rank_0(tmp_path):
    """The classic pi program reads its interval count from stdin on rank 0: forwarded as
    mpirun does (before, the ranks' stdin was /dev/null)."""
    script = tmp_path / "pi.py"
    script.write_text(PI_FROM_STDIN)
    res = train(tmp_path, "--nproc", 2, script, stdin="1000\n", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pi 3.141593" in res.stdout, res.stdout


SPAWN = """
import sys
from mpi4py import MPI
from fluidctl.backends.mpi.launcher import local_slots
if sys.argv[1:] == ["child"]:
    parent = MPI.Comm.Get_parent()
    parent.send(MPI.COMM_WORLD.Get_rank() + 100, dest=0)
    parent.Disconnect()
    sys.exit(0)
n = local_slots()          # as many as the cores: more than the slots left beside the parent
children = MPI.COMM_SELF.Spawn(sys.executable, args=[__file__, "child"], maxprocs=n)
got = sorted(children.recv(source=i) for i in range(n))
children.Disconnect()
print("SPAWNED", got, flush=True)
"""


def test_spawned_ranks_find_room_on_one_node(tmp_path):
    """MPI_Comm_spawn under --nproc 1: on one node mpirun may oversubscribe, so the spawned
    ranks are started instead of 'not enough slots'."""
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    res = train(tmp_path, "--nproc", 1, script, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    n = mpi.local_slots()
    assert f"SPAWNED {[100 + i for i in range(n)]}" in res.stdout, res.stdout
