"""`fluidctl train --mode pserver`: pservers and trainers started, supervised and stopped by the
launcher, or trainers against pservers already running (--pserver-endpoints)."""
import json
import re
import signal

import psutil
import pytest

from launchutil import BEHAVE, TEMPLATES, assert_all_gone, fluidctl, start_fluidctl, wait_for

TEMPLATE = TEMPLATES / "train_pserver.py"


def test_pserver_mode_contract(tmp_path):
    res = fluidctl("train", "--mode", "pserver", "--pservers", 2, "--nproc", 3, "--async",
                   "--dry-run", "--json", BEHAVE, cwd=tmp_path, check=0)
    plan = json.loads(res.stdout)
    roles = [(p["role"], p["rank"]) for p in plan["procs"]]
    assert roles == [("pserver", 0), ("pserver", 1), ("trainer", 0), ("trainer", 1),
                     ("trainer", 2)]
    pservers = plan["pserver_endpoints"]
    assert len(pservers) == 2
    for proc in plan["procs"]:
        env = proc["env"]
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == ",".join(pservers)
        assert env["PADDLE_TRAINERS_NUM"] == env["PADDLE_INIT_NUM_GRADIENT_SERVERS"] == "3"
        assert env["PADDLE_INIT_PSERVERS"] == "127.0.0.1,127.0.0.1"
        assert env["FLUIDCTL_SYNC_MODE"] == "async"
        assert env["POD_IP"] == "127.0.0.1" and env["PADDLE_INIT_USE_GPU"] == "0"
        assert env["PADDLE_PORT"] == env["PADDLE_INIT_PORT"] == proc["endpoint"].split(":")[1]
        if proc["role"] == "pserver":
            assert env["TRAINING_ROLE"] == "PSERVER"
            assert proc["argv"][1:4] == ["-u", "-m", "fluidctl.runtime.pserver"]
            assert proc["log"].endswith(f"serverlog.{proc['rank']}")
        else:
            assert env["TRAINING_ROLE"] == "TRAINER"
            assert env["PADDLE_TRAINER_ID"] == env["PADDLE_INIT_TRAINER_ID"] == str(proc["rank"])
            assert env["PADDLE_LOCAL_RANK"] == str(proc["rank"])
            assert proc["log"].endswith(f"workerlog.{proc['rank']}")


@pytest.mark.parametrize("mode", ["--sync", "--async"])
def test_pserver_job_runs_and_stops_its_pservers(tmp_path, mode):
    res = fluidctl("train", "--mode", "pserver", "--pservers", 2, "--nproc", 2, mode,
                   "--tee", "all", TEMPLATE, "--steps", 60, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(re.findall(r"\[trainer \d\] trainer \d done: loss", res.stdout)) == 2
    for i in range(2):
        log = (tmp_path / "mylog" / f"serverlog.{i}").read_text()
        assert f"pserver {i} stopped" in log                 # SIGTERM: a clean stop
    launch = (tmp_path / "mylog" / "launch.log").read_text()
    assert re.search(r"pserver 0 \(pid \d+\) stopped with code 0", launch)


def test_a_dying_pserver_fails_the_job_fast(tmp_path):
    proc = start_fluidctl("train", "--mode", "pserver", "--pservers", 2, "--nproc", 2,
                          "--grace-period", 2, BEHAVE, "--hang", cwd=tmp_path)
    launch = tmp_path / "mylog" / "launch.log"
    started = wait_for(lambda: launch.exists() and re.search(
        r"pserver 1 pid (\d+)", launch.read_text()), what="the pservers to start")
    trainers = [int(p) for p in re.findall(r"trainer \d pid (\d+)", launch.read_text())]
    psutil.Process(int(started.group(1))).kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "pserver 1 failed on 127.0.0.1: signal SIGKILL" in err
    assert "mylog/serverlog.1" in err
    assert_all_gone(trainers)


def test_trainers_use_pservers_already_running(tmp_path):
    import pserverutil as local
    token_file = tmp_path / "job.token"
    token_file.write_text("s3cret-token\n")
    endpoints = [f"127.0.0.1:{p}" for p in local.free_ports(2)]
    servers = [local.start_pserver(i, endpoints, trainers=2, token="s3cret-token",
                                   log_path=str(tmp_path / f"standalone.{i}.log"))
               for i in range(2)]
    try:
        res = fluidctl("train", "--mode", "pserver", "--pserver-endpoints", ",".join(endpoints),
                       "--token-file", token_file, "--nproc", 2, TEMPLATE, "--steps", 40,
                       cwd=tmp_path, timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "done: loss" in res.stdout
        assert not (tmp_path / "mylog" / "serverlog.0").exists()   # nothing started by us
        assert all(s.poll() is None for s in servers)              # and nothing stopped
    finally:
        assert local.stop(servers) == [0, 0]


def test_wrong_token_against_running_pservers_fails_clearly(tmp_path):
    import pserverutil as local
    endpoints = [f"127.0.0.1:{local.free_ports(1)[0]}"]
    server = local.start_pserver(0, endpoints, trainers=1, token="right")
    try:
        res = fluidctl("train", "--mode", "pserver", "--pserver-endpoints", endpoints[0],
                       "--env", "FLUIDCTL_TIMEOUT=20", TEMPLATE, "--steps", 5, cwd=tmp_path,
                       timeout=120, env={"FLUIDCTL_JOB_TOKEN": "wrong"})
        assert res.returncode != 0
        assert "token" in (tmp_path / "mylog" / "workerlog.0").read_text().lower()
        assert server.poll() is None                               # the server kept serving
    finally:
        local.stop([server])


def test_token_file_errors(tmp_path):
    (tmp_path / "empty").write_text("\n")
    for name, message in (("empty", "token file empty is empty"),
                          ("missing", "cannot read token file missing")):
        res = fluidctl("train", "--token-file", name, BEHAVE, cwd=tmp_path)
        assert res.returncode == 2 and message in res.stderr, res.stderr
