"""mpirun command building against golden strings, the hostfile, the master port, and which rank
mpirun names as the first to fail (recorded reports)."""
import pytest

from fluidctl.backends.mpi import launcher as mpi
from fluidctl.planning.hosts import parse_hosts_arg


def test_golden_commands():
    hosts = parse_hosts_arg("node1:2,node2:2")
    cmd = mpi.command(mpi.worker_argv("train.py", ["--epochs", "3"], python="/opt/py/bin/python"),
                      4, hosts=hosts, hostfile="/logs/hostfile", env_names=["PATH", "FLUIDCTL_JOB_TOKEN",
                                                                         "MY_SETTING", "PATH"],
                      as_root=False, mpirun="/usr/bin/mpirun")
    assert " ".join(cmd) == (
        "/usr/bin/mpirun -np 4 --hostfile /logs/hostfile --map-by slot --bind-to none "
        "-x FLUIDCTL_JOB_TOKEN -x MY_SETTING -x PATH "
        "/opt/py/bin/python -m fluidctl worker train.py --epochs 3")
    # more ranks than slots: --oversubscribe; root: --allow-run-as-root; a wheel: --prefix
    cmd = mpi.command(["python", "t.py"], 6, hosts=hosts, hostfile="h", as_root=True,
                      mpirun="/v/bin/mpirun", prefix="/v", ssh_config="/tmp/cfg", map_by="node")
    assert cmd == ["/v/bin/mpirun", "--allow-run-as-root", "-np", "6", "--hostfile", "h",
                   "--prefix", "/v", "--mca", "plm_ssh_args", "-F /tmp/cfg", "--map-by", "node",
                   "--bind-to", "none", "--oversubscribe", "python", "t.py"]
    # no hostfile: local slots are the physical cores
    many = mpi.local_slots() + 1
    assert "--oversubscribe" in mpi.command(["x"], many, as_root=False, mpirun="m")
    assert "--oversubscribe" not in mpi.command(["x"], 1, as_root=False, mpirun="m")


def test_hostfile_written_whole(tmp_path):
    hosts = parse_hosts_arg("node1:2,root@node2:3")
    path = mpi.write_hostfile(hosts, tmp_path / "run" / "hostfile")
    assert path.read_text() == "node1 slots=2\nnode2 slots=3\n"
    assert [p.name for p in path.parent.iterdir()] == ["hostfile"]


def test_master_port_never_repeats_a_rank_endpoint(monkeypatch):
    """Ports are probed and released, so the kernel may hand the same one out twice: the
    master's is drawn again until it differs from every endpoint on that address."""
    from fluidctl import net
    from fluidctl.node import worker
    draws = iter([5001, 5002, 6000])
    monkeypatch.setattr(net, "free_port", lambda address: next(draws))   # imported at the call
    pairs = [("127.0.0.1", 5001), ("127.0.0.1", 5002), ("127.0.0.2", 6000)]
    assert worker.master_port_beside("127.0.0.1", pairs) == 6000


@pytest.mark.parametrize("report, found", [
    # Open MPI 5 (prterun), as it printed here: exit code, then a signal (wrapped mid-sentence)
    ("prterun detected that one or more processes exited with non-zero status,\nthus causing "
     "the job to be terminated. The first process to do so was:\n\n   Process name: "
     "[prterun-vm-20100@1,1]\n   Exit code:    1\n", (1, None, 1, None)),
    ("prterun noticed that process rank 1 with PID 20265 on node vm exited on\nsignal 11 "
     "(Segmentation fault).\n", (1, "vm", -11, 20265)),
    # Open MPI 4 (mpirun)
    ("mpirun detected that one or more processes exited with non-zero status, thus causing\n"
     "the job to be terminated. The first process to do so was:\n\n  Process name: "
     "[[41279,1],3]\n  Exit code:    7\n", (3, None, 7, None)),
    ("mpirun noticed that process rank 2 with PID 0 on node n2 exited on signal 9 (Killed).\n",
     (2, "n2", -9, None)),
    ("rank 0 ready\n", None),
])
def test_the_rank_mpirun_names_as_the_first_to_fail(report, found):
    from fluidctl.backends.mpi.launcher import first_failed_rank
    assert first_failed_rank(report) == found
