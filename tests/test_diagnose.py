"""Hang autopsy, fluidctl dump, failure triage and the echo options on real jobs
(fluidctl train, real processes, the real runtime)."""
import json
import re
import os
import signal
import time
from pathlib import Path

import pytest

from launchutil import ROOT, fluidctl, start_fluidctl, wait_for
from test_triage import make_memory_cgroup

TROUBLE = str(ROOT / "tests" / "scripts" / "trouble.py")


def line_of(code: str) -> int:
    """The line of trouble.py holding ``code`` (exactly once)."""
    (n,) = [i for i, l in enumerate(Path(TROUBLE).read_text().splitlines(), 1) if code in l]
    return n


STUCK = line_of("    ctx.allreduce(x)  # stuck")
LOADER = line_of("time.sleep(3600)")
RAISE = line_of("raise ValueError")
IDLE = line_of("time.sleep(0.5)")


def hang_dir(log_dir: Path) -> Path:
    (found,) = list(log_dir.glob("hang-*"))
    return found


@pytest.mark.parametrize("pyspy", [True, False], ids=["py-spy", "faulthandler"])
def test_hang_is_diagnosed_with_both_stacks_and_exit_124(tmp_path, pyspy):
    from fluidctl.diagnostics import stacks
    if pyspy and not stacks.pyspy_path():
        pytest.skip("py-spy not installed (pip install 'fluidctl[debug]')")
    env = {} if pyspy else {"FLUIDCTL_PYSPY": ""}
    proc = fluidctl("train", "--nproc", 3, "--hang-timeout", 2, "--log-dir", tmp_path / "log",
                    TROUBLE, "stuck", cwd=tmp_path, env=env)
    assert proc.returncode == 124, proc.stderr
    err = proc.stderr
    assert "fluidctl: the job hung: no rank wrote to its log and no collective completed for " \
           "2s" in err
    assert f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}" in err, err
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in err, err
    where = hang_dir(tmp_path / "log")
    assert f"every rank's full stack: {where}/" in err
    method = "py-spy" if pyspy else "faulthandler"
    for rank in range(3):
        text = (where / f"rank-{rank}.txt").read_text()
        assert text.startswith(f"# rank {rank} on 127.0.0.1, taken with {method}")
    assert "load_batch" in (where / "rank-1.txt").read_text()
    if not pyspy:
        assert "note: py-spy is off (FLUIDCTL_PYSPY is empty); using faulthandler instead" in err
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["exit_code"] == 124 and report["first_failure"] is None
    assert report["hang"]["summary"][0] == f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}"
    assert [p["state"].startswith("still running; stopped by fluidctl")
            for p in report["processes"]] == [True] * 3
    assert not (tmp_path / "log" / "job.json").exists()


def test_hang_timeout_from_the_environment_and_bad_values(tmp_path):
    proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log", TROUBLE, "stuck",
                    cwd=tmp_path, env={"FLUIDCTL_HANG_TIMEOUT": "2"})
    assert proc.returncode == 124 and "the job hung" in proc.stderr
    bad = fluidctl("train", "--hang-timeout", 0, TROUBLE, "stuck", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("error: --hang-timeout 0 is not positive (give seconds, e.g. "
                                  "--hang-timeout 600, or leave it out)")
    refused = fluidctl("train", "--backend", "mpi", "--tee-ranks", "0", TROUBLE, "stuck",
                       cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "--tee-ranks needs fluidctl's own supervision of every rank" in refused.stderr


def test_collectives_completing_in_silence_are_not_a_hang(tmp_path):
    # 4 s of allreduces and not a line of output: the runtime's progress counter keeps the
    # 1 s watchdog quiet
    proc = fluidctl("train", "--nproc", 2, "--hang-timeout", 1, "--log-dir", tmp_path / "log",
                    TROUBLE, "busy", 4, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / "log").glob("hang-*"))
    assert not (tmp_path / "log" / "failure.json").exists()


def test_fluidctl_dump_on_a_running_job(tmp_path):
    log = tmp_path / "log"
    job = start_fluidctl("train", "--nproc", 2, "--log-dir", log, TROUBLE, "wait",
                         cwd=tmp_path)
    try:
        wait_for(lambda: all("ready" in (log / f"workerlog.{r}").read_text()
                             for r in range(2) if (log / f"workerlog.{r}").exists())
                 and (log / "job.json").exists(), 60, "both ranks ready")
        out = fluidctl("dump", "--log-dir", log, cwd=tmp_path, timeout=90)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("fluidctl dump: the running job's stacks\n")
        assert f"ranks 0,1 are in idle at trouble.py:{IDLE}" in out.stdout, out.stdout
        (where,) = list(log.glob("dump-*"))
        assert (where / "rank-0.txt").exists() and (where / "rank-1.txt").exists()
        assert job.poll() is None                 # the job goes on
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    assert job.returncode == 143
    gone = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert gone.returncode == 2
    assert gone.stderr.startswith(f"error: no running job in {log}")


def test_fluidctl_dump_of_a_job_launched_on_another_machine_is_refused(tmp_path):
    """LOG_DIR may be shared (Slurm, NFS): a launcher pid from job.json written on another host
    must not be signalled here, where it is some other process (here: pytest itself)."""
    log = tmp_path / "log"
    log.mkdir()
    (log / "job.json").write_text(json.dumps({"pid": os.getpid(), "host": "gpu042",
                                              "started": time.time()}))
    out = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (f"error: the job in {log} has its launcher on gpu042, not on this "
                          f"machine (run it there: ssh gpu042 fluidctl dump --log-dir {log})\n")
    # a Slurm job's launcher is reached through Slurm (compute nodes often refuse plain ssh)
    (log / "job.json").write_text(json.dumps({"pid": os.getpid(), "host": "gpu042",
                                              "slurm_job_id": "5150", "started": time.time()}))
    out = fluidctl("dump", "--log-dir", log, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.endswith(f"(run it there: srun --jobid 5150 --overlap -w gpu042 fluidctl "
                               f"dump --log-dir {log})\n"), out.stderr


def test_failure_report_names_the_exception_and_every_other_rank(tmp_path):
    proc = fluidctl("train", "--nproc", 3, "--log-dir", tmp_path / "log", "--grace-period", 1,
                    TROUBLE, "raise", cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert "fluidctl: trainer 1 failed on 127.0.0.1: exit code 1" in err
    assert "s after start)" in err
    assert f"why: ValueError: shard 1 has 0 records (at trouble.py:{RAISE})" in err, err
    assert "trainer 0 on 127.0.0.1: still running; stopped by fluidctl" in err
    assert "trainer 2 on 127.0.0.1: still running; stopped by fluidctl" in err
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    first = report["first_failure"]
    assert (first["label"], first["kind"], first["exit_code"]) == ("trainer 1", "exception", 1)
    assert first["explanation"] == f"ValueError: shard 1 has 0 records (at trouble.py:{RAISE})"
    assert first["seconds_since_start"] > 0
    assert first["log_tail"][-1] == "ValueError: shard 1 has 0 records"
    assert sorted(p["label"] for p in report["processes"]) == ["trainer 0", "trainer 1",
                                                               "trainer 2"]


def test_segfault_is_named(tmp_path):
    proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log", "--grace-period", 1,
                    TROUBLE, "segv", cwd=tmp_path)
    assert proc.returncode == 139
    assert "failed on 127.0.0.1: signal SIGSEGV" in proc.stderr
    assert "why: crashed (SIGSEGV: segmentation fault in native code" in proc.stderr


def test_oom_kill_in_a_memory_limited_cgroup(tmp_path):
    cgroup = make_memory_cgroup(128 << 20)
    if cgroup is None:
        pytest.skip("cannot create a memory-limited cgroup here")
    try:
        proc = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log",
                        "--grace-period", 1, TROUBLE, "oom", cgroup, cwd=tmp_path)
    finally:
        os.rmdir(cgroup)
    assert proc.returncode == 137, proc.stderr
    assert "trainer 1 failed on 127.0.0.1: signal SIGKILL" in proc.stderr
    assert "why: killed for memory: it used" in proc.stderr, proc.stderr
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["first_failure"]["kind"] == "oom"
    assert report["first_failure"]["signal"] == "SIGKILL"


def test_tee_ranks_and_progress_bars_collapsed_in_the_echo_only(tmp_path):
    proc = fluidctl("train", "--nproc", 3, "--tee-ranks", "0,2", "--log-dir", tmp_path / "log",
                    TROUBLE, "progress", cwd=tmp_path, check=0)
    lines = proc.stdout.splitlines()
    for rank in (0, 2):
        mine = [l for l in lines if l.startswith(f"[trainer {rank}] ")]
        assert mine == [f"[trainer {rank}] rank {rank} ready", f"[trainer {rank}] step 5/5",
                        f"[trainer {rank}] done"], lines
    assert not any(l.startswith("[trainer 1]") for l in lines)
    assert (tmp_path / "log" / "workerlog.1").read_bytes().count(b"\rstep") == 5  # file: all
    bad = fluidctl("train", "--nproc", 2, "--tee-ranks", "0,5", TROUBLE, "progress",
                   cwd=tmp_path)
    assert bad.returncode == 2
    assert "error: --tee-ranks names rank 5, but the job has 2 trainer(s)" in bad.stderr


# --- over SSH: two sshd nodes on 127.0.0.2 and 127.0.0.3, two ranks each ---------------------

@pytest.fixture
def nodes(sshd_nodes):
    return ["--hostfile", sshd_nodes.hostfile("hosts.2x2", slots=2),
            "--ssh-config", sshd_nodes.config]


def test_hang_over_ssh_names_every_rank_on_every_node(tmp_path, nodes):
    proc = fluidctl("train", *nodes, "--hang-timeout", 3, "--log-dir", tmp_path / "log",
                    TROUBLE, "stuck", cwd=tmp_path, timeout=180)
    assert proc.returncode == 124, proc.stderr
    assert f"ranks 0,2,3 wait in allreduce at trouble.py:{STUCK}" in proc.stderr, proc.stderr
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in proc.stderr
    where = hang_dir(tmp_path / "log")
    assert (where / "rank-3.txt").read_text().startswith("# rank 3 on node2, taken with ")
    assert (where / "rank-1.txt").read_text().startswith("# rank 1 on node1, taken with ")
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    # every rank as its agent reported it; a node whose agent's last record was cut off when
    # its channel closed (seen under load) is one "node X" line instead (known limitation)
    seen = {(p["label"], p["host"]) for p in report["processes"]}
    for host, ranks in (("node1", (0, 1)), ("node2", (2, 3))):
        assert {(f"trainer {r}", host) for r in ranks} <= seen or (f"node {host}", host) in seen
    assert all(p["state"] for p in report["processes"]), report["processes"]


def test_fluidctl_dump_over_ssh(tmp_path, nodes):
    log = tmp_path / "log"
    job = start_fluidctl("train", *nodes, "--log-dir", log, TROUBLE, "wait", cwd=tmp_path)
    try:
        def ready():
            files = [log / n / f"workerlog.{r}" for n, r in
                     (("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3))]
            return all(f.exists() and "ready" in f.read_text() for f in files)
        wait_for(ready, 90, "four ranks ready")
        out = fluidctl("dump", "--log-dir", log, cwd=tmp_path, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"ranks 0,1,2,3 are in idle at trouble.py:{IDLE}" in out.stdout, out.stdout
        assert job.poll() is None
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=90)


@pytest.mark.parametrize("backend", ["ssh", "fabric"])
def test_failure_triage_over_ssh(tmp_path, nodes, backend):
    proc = fluidctl("train", *nodes, "--backend", backend, "--log-dir", tmp_path / "log",
                    "--grace-period", 1, TROUBLE, "raise", cwd=tmp_path, timeout=180)
    assert proc.returncode == 1
    err = proc.stderr
    assert "fluidctl: trainer 1 failed on node1: exit code 1" in err, err
    assert f"why: ValueError: shard 1 has 0 records (at trouble.py:{RAISE})" in err
    for label, host in (("trainer 0", "node1"), ("trainer 2", "node2"), ("trainer 3", "node2")):
        assert f"{label} on {host}: still running; stopped by fluidctl" in err, err
    first = json.loads((tmp_path / "log" / "failure.json").read_text())["first_failure"]
    assert (first["host"], first["kind"]) == ("node1", "exception")


def test_tee_ranks_over_ssh_prefix_node_and_rank_and_keep_progress_in_the_files(tmp_path,
                                                                                 nodes):
    proc = fluidctl("train", *nodes, "--tee-ranks", "0,3", "--log-dir", tmp_path / "log",
                    TROUBLE, "progress", cwd=tmp_path, timeout=180, check=0)
    lines = proc.stdout.splitlines()
    assert [l for l in lines if l.startswith("[node2:3] ")] == [
        "[node2:3] rank 3 ready", "[node2:3] step 5/5", "[node2:3] done"], lines
    assert [l for l in lines if l.startswith("[node1:0] ")][-2:] == [
        "[node1:0] step 5/5", "[node1:0] done"]
    assert not any(l.startswith(("[node1:1]", "[node2:2]")) for l in lines)
    copy = (tmp_path / "log" / "node2" / "workerlog.3").read_bytes()
    assert copy.count(b"\rstep") == 5 and copy.endswith(b"step 5/5\ndone\n"), copy


def test_a_busy_master_port_is_reported_before_any_rank_starts(tmp_path, nodes):
    from fluidctl.net import bind_socket
    # ports P.. on node1 (127.0.0.2): trainers P, P+1, then the master P+2; hold P+2
    probe = bind_socket("127.0.0.2", 0)
    first = probe.getsockname()[1]
    probe.close()
    busy = bind_socket("127.0.0.2", first + 2)
    busy.listen(1)
    try:
        proc = fluidctl("train", *nodes, "--started-port", first, "--log-dir", tmp_path / "log",
                        TROUBLE, "wait", cwd=tmp_path, timeout=120)
    finally:
        busy.close()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"error: node node1: port 127.0.0.2:{first + 2} (the master port) is in use (stop "
        "what holds it, or let fluidctl pick free ports: drop --started-port)",
        "error: the rendezvous check found 1 problem(s) (fix the lines above; nothing was "
        "started)"], lines
    assert not list((tmp_path / "log").glob("node*/workerlog.*"))    # no rank started


def test_an_unreachable_master_is_named_by_the_node_that_cannot_reach_it(tmp_path, nodes):
    from fluidctl.node import doctor
    # the agents' own check, as node 2 runs it: nothing listens on the master port
    from fluidctl.net import bind_socket
    s = bind_socket("127.0.0.2", 0)
    port = s.getsockname()[1]
    s.close()
    problems, held = doctor.node_checks({"address": "127.0.0.3", "ports": [],
                                         "connect": ["127.0.0.2", port]})
    assert held is None
    assert problems == [f"cannot reach the master 127.0.0.2:{port} (Connection refused: open "
                        "the port between the nodes, or list node 0 under an address this node "
                        "can reach)"]
    problems, held = doctor.node_checks({"address": "127.0.0.2", "ports": [],
                                         "listen": ["10.255.255.1", port]})
    assert problems[0].startswith("MASTER_ADDR 10.255.255.1 is not an address of this node")


def test_socket_interface_is_exported_unless_the_user_set_it(tmp_path, nodes):
    plan = json.loads(fluidctl("train", *nodes, "--dry-run", "--json", TROUBLE, "wait",
                               cwd=tmp_path, timeout=120, check=0).stdout)
    env = plan["procs"][3]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "=lo" and env["GLOO_SOCKET_IFNAME"] == "lo"  # NCCL: exact
    mine = json.loads(fluidctl("train", *nodes, "--dry-run", "--json", "--env",
                               "NCCL_SOCKET_IFNAME=eth9", TROUBLE, "wait", cwd=tmp_path,
                               timeout=120, check=0).stdout)
    env = mine["procs"][0]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "eth9" and "GLOO_SOCKET_IFNAME" not in env


def test_node_interface_from_recorded_probes():
    from fluidctl.backends import doctor
    a = {"lo": [["127.0.0.1", "255.0.0.0"]], "eth0": [["10.0.0.5", "255.255.255.0"]]}
    b = {"lo": [["127.0.0.1", "255.0.0.0"]], "ens3": [["10.0.0.6", "255.255.255.0"]]}
    assert doctor.node_interface("10.0.0.5", a) == "eth0"
    assert doctor.node_interface("127.0.0.3", a) == "lo"
    assert doctor.socket_ifnames(["10.0.0.5", "10.0.0.6"], [{"ifaces": a}, {"ifaces": b}]) \
        == "eth0,ens3"
    assert doctor.socket_ifnames(["10.0.0.5", "192.168.1.1"],
                                 [{"ifaces": a}, {"ifaces": b}]) is None


# --- under mpirun: the ranks are mpirun's, their stacks are taken on their nodes -------------

def test_hang_under_mpirun_on_one_node(tmp_path):
    """--backend mpi: each rank's worker registers in the diagnostics dir in LOG_DIR, and a
    second mpirun (one stack taker per node) takes the stacks."""
    proc = fluidctl("train", "--backend", "mpi", "--nproc", 3, "--hang-timeout", 4,
                    "--log-dir", tmp_path / "log", TROUBLE, "stuck", cwd=tmp_path, timeout=180)
    assert proc.returncode == 124, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert f"ranks 0,2 wait in allreduce at trouble.py:{STUCK}" in proc.stderr, proc.stderr
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in proc.stderr
    where = hang_dir(tmp_path / "log")
    assert sorted(p.name for p in where.iterdir()) == [
        "rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    assert json.loads((tmp_path / "log" / "failure.json").read_text())["hang"]["dir"] == \
        str(where)
    assert not list((tmp_path / "log").glob(".fluidctl_diag.*"))


def test_a_crash_under_mpirun_is_reported_as_that_rank(tmp_path):
    """mpirun exits 1 whatever happened; the report names the rank mpirun saw fail first,
    with its signal, node and pid, and triage explains the crash from its own log."""
    proc = fluidctl("train", "--backend", "mpi", "--nproc", 3, "--log-dir", tmp_path / "log",
                    TROUBLE, "segv", cwd=tmp_path, timeout=180)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    # the pid is there when prterun prints its "noticed that process rank 1 with PID ..."
    # wording; which of its two wordings it prints is a race inside prterun (~1 run in 5 here)
    assert re.search(r"fluidctl: trainer 1 failed on \S+: signal SIGSEGV \((pid \d+|at )",
                     proc.stderr), proc.stderr
    assert "why: crashed (SIGSEGV" in proc.stderr
    assert f"log: {tmp_path / 'log' / 'workerlog.1'}" in proc.stderr
    report = json.loads((tmp_path / "log" / "failure.json").read_text())
    assert report["first_failure"]["label"] == "trainer 1"
    assert report["first_failure"]["signal"] == "SIGSEGV"


def test_hang_under_mpirun_over_two_ssh_nodes(tmp_path, sshd_nodes):
    """mpirun reaches the nodes over ssh: ranks and stack takers name their node by the
    address ssh reached it at, so the two "nodes" of one host stay apart. py-spy off: the
    faulthandler signal goes to the rank processes on each node (FLUIDCTL_PYSPY='' reaches
    the takers through mpirun's -x)."""
    proc = fluidctl("train", "--backend", "mpi", "--hostfile",
                    sshd_nodes.hostfile("h", slots=2), "--ssh-config", sshd_nodes.config,
                    "--hang-timeout", 5, "--log-dir", tmp_path / "log", TROUBLE, "stuck",
                    cwd=tmp_path, timeout=180,
                    env={"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_coll": "^han",
                         "FLUIDCTL_PYSPY": ""})
    assert proc.returncode == 124, proc.stderr
    assert f"ranks 0,2,3 wait in allreduce at trouble.py:{STUCK}" in proc.stderr, proc.stderr
    assert f"rank 1 is in load_batch at trouble.py:{LOADER}" in proc.stderr
    assert "note: py-spy is off (FLUIDCTL_PYSPY is empty); using faulthandler instead" \
        in proc.stderr
    where = hang_dir(tmp_path / "log")
    for rank, node in ((0, "127.0.0.2"), (1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.3")):
        text = (where / f"rank-{rank}.txt").read_text()
        assert text.startswith(f"# rank {rank} on {node}, taken with faulthandler"), text[:200]
