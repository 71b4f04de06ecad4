"""`fluidctl train` on one machine: environment, supervision, signals, restarts, logs, bad input.

Every test runs the real CLI, which starts real worker processes (tests/scripts/behave.py).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from launchutil import (BEHAVE, assert_all_gone, fluidctl, read_pids, start_fluidctl,
                        wait_for)
from badinput import TRAIN_BAD_INPUT, TRAIN_BAD_INPUT_E2E


def dump_env(tmp_path, rank):
    return json.loads((tmp_path / f"env.{rank}.json").read_text())


# --- the environment contract ----------------------------------------------------------------

def test_every_rank_gets_the_collective_contract(tmp_path):
    (tmp_path / "job.env").write_text("# comment\nexport FROM_FILE='yes'\n\nSHARED=file\n")
    fluidctl("train", "--nproc", 3, "--env", "FOO=bar=baz", "--env", "SHARED=cli",
                   "--env-file", "job.env", BEHAVE, "--env-dump", tmp_path, "--weird", "-x",
                   "--", "tail", cwd=tmp_path, check=0)
    envs = [dump_env(tmp_path, r)["env"] for r in range(3)]
    endpoints = envs[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(endpoints) == 3 and len(set(endpoints)) == 3
    master = envs[0]["PADDLE_MASTER"]
    assert master not in endpoints
    for rank, env in enumerate(envs):
        for name in ("PADDLE_TRAINER_ID", "PADDLE_GLOBAL_RANK", "RANK"):
            assert env[name] == str(rank)
        for name in ("PADDLE_TRAINERS_NUM", "PADDLE_NUM_TRAINERS", "PADDLE_GLOBAL_SIZE",
                     "WORLD_SIZE", "PADDLE_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
            assert env[name] == "3"
        for name in ("PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK", "LOCAL_RANK"):
            assert env[name] == str(rank)
        assert env["PADDLE_NNODES"] == "1"
        # DeepSpeed's names: processes on this node, node rank, node count
        assert (env["LOCAL_SIZE"], env["CROSS_RANK"], env["CROSS_SIZE"]) == ("3", "0", "1")
        assert env["PADDLE_CURRENT_ENDPOINT"] == endpoints[rank]
        assert env["PADDLE_TRAINER_ENDPOINTS"] == ",".join(endpoints)
        assert env["PADDLE_MASTER"] == master == f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        assert env["PADDLE_DISTRI_BACKEND"] == "gloo"
        assert env["TRAINING_ROLE"] == env["PADDLE_ROLE"] == "TRAINER"
        expected_threads = str(max(1, (os.cpu_count() or 1) // 3))
        assert env["CPU_NUM"] == env["OMP_NUM_THREADS"] == expected_threads
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["PADDLE_RESTART_COUNT"] == "0"
        assert env["FOO"] == "bar=baz" and env["FROM_FILE"] == "yes"
        assert env["SHARED"] == "cli"                   # --env wins over --env-file
        assert "FLAGS_selected_gpus" not in env         # CPU job
        assert len(env["FLUIDCTL_JOB_TOKEN"]) == 32
    # SCRIPT_ARGS reach the script untouched, option-looking ones included
    assert dump_env(tmp_path, 0)["rest"] == ["--weird", "-x", "--", "tail"]


def test_user_thread_settings_are_kept(tmp_path):
    fluidctl("train", "--nproc", 2, "--env", "OMP_NUM_THREADS=7", BEHAVE,
             "--env-dump", tmp_path, cwd=tmp_path, env={"CPU_NUM": "5"}, check=0)
    env = dump_env(tmp_path, 1)["env"]
    assert env["OMP_NUM_THREADS"] == "7" and env["CPU_NUM"] == "5"


def test_started_port_lays_out_endpoints_then_master(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    # pick a base whose next two ports are free too, without racing: let the OS decide
    res = fluidctl("train", "--nproc", 2, "--started-port", base, "--dry-run", "--json", BEHAVE,
                   cwd=tmp_path)
    if res.returncode == 2:
        pytest.skip(f"ports near {base} are taken: {res.stderr}")
    plan = json.loads(res.stdout)
    assert plan["trainer_endpoints"] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    assert plan["master"] == f"127.0.0.1:{base + 2}"


def test_dry_run_prints_a_table_and_starts_nothing(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--dry-run", BEHAVE, "--hang", cwd=tmp_path, check=0)
    for column in ("rank", "role", "host", "endpoint", "devices", "command"):
        assert column in res.stdout
    assert res.stdout.count("trainer") >= 2 and "--hang" in res.stdout
    assert not (tmp_path / "mylog").exists()


def test_dry_run_json_has_every_environment(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--dry-run", "--json", "--env", "A=1", BEHAVE,
                   cwd=tmp_path, check=0)
    plan = json.loads(res.stdout)
    assert [p["rank"] for p in plan["procs"]] == [0, 1]
    assert plan["procs"][1]["env"]["PADDLE_TRAINER_ID"] == "1"
    assert plan["procs"][1]["env"]["A"] == "1"
    assert plan["procs"][0]["argv"][1:] == ["-u", BEHAVE]
    assert not (tmp_path / "mylog").exists()


def test_non_python_script_is_executed(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho \"shell rank $PADDLE_TRAINER_ID of $WORLD_SIZE: $1\"\n")
    script.chmod(0o755)
    res = fluidctl("train", "--nproc", 2, "--tee", "all", "./job.sh", "hi", cwd=tmp_path, check=0)
    assert "[trainer 1] shell rank 1 of 2: hi" in res.stdout


# --- GPUs (a fake nvidia-smi: this machine has none) -----------------------------------------

@pytest.fixture
def fake_gpus(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(
        f"echo 'GPU {i}: Tesla V100 (UUID: GPU-{i}aaa)'\n" for i in range(4)))
    smi.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def _plan(tmp_path, *args, env=None):
    res = fluidctl("train", *args, "--dry-run", "--json", BEHAVE, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_gpu_ids_assign_one_device_per_process(tmp_path, fake_gpus):
    plan = _plan(tmp_path, "--gpus", "0,2,3", env=fake_gpus)
    envs = [p["env"] for p in plan["procs"]]
    assert [p["devices"] for p in plan["procs"]] == [["0"], ["2"], ["3"]]
    assert all(e["CUDA_VISIBLE_DEVICES"] == "0,2,3" for e in envs)
    assert [e["FLAGS_selected_gpus"] for e in envs] == ["0", "1", "2"]
    assert all(e["PADDLE_DISTRI_BACKEND"] == "nccl" for e in envs)
    # Paddle's format: one entry per trainer, its index into its CUDA_VISIBLE_DEVICES (10)
    assert envs[0]["PADDLE_WORLD_DEVICE_IDS"] == "0,1,2"
    assert all(e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for e in envs)   # nvidia-smi's order (13)


def test_gpu_default_is_one_process_per_visible_gpu(tmp_path, fake_gpus):
    plan = _plan(tmp_path, env={**fake_gpus, "CUDA_VISIBLE_DEVICES": "3,GPU-1aaa"})
    assert [p["devices"] for p in plan["procs"]] == [["3"], ["1"]]
    plan = _plan(tmp_path, "--gpus", "1", env={**fake_gpus, "CUDA_VISIBLE_DEVICES": "2,3"})
    assert [p["devices"] for p in plan["procs"]] == [["2"]]


def test_no_gpu_default_is_one_cpu_process(tmp_path):
    plan = _plan(tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert len(plan["procs"]) == 1 and plan["procs"][0]["devices"] == []


# --- supervision -----------------------------------------------------------------------------

def test_fail_fast_reports_the_first_failure_and_leaves_nothing(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    wait_file = tmp_path / "go"
    proc = start_fluidctl("train", "--nproc", 3, "--grace-period", 2, BEHAVE, "--hang",
                          "--grandchild", "--fail-rank", 1, "--code", 5, "--pidfile", pid_dir,
                          "--wait-file", wait_file, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 3, what="3 ranks ready")
    pids = read_pids(pid_dir, range(3))
    wait_file.write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert "trainer 1 failed" in err and "exit code 5" in err
    assert "mylog/workerlog.1" in err and "rank 1 failing with 5" in err
    assert len(err.strip().splitlines()) < 30          # a short report, not a wall of text
    assert_all_gone(pids)                               # ranks and their grandchildren
    launch = (tmp_path / "mylog" / "launch.log").read_text()
    assert "sent SIGTERM to trainer 0, trainer 2" in launch
    assert "SIGKILL" not in launch                      # they obeyed SIGTERM in time


def test_rank_killed_by_signal_gives_128_plus_n(tmp_path):
    res = fluidctl("train", "--nproc", 2, BEHAVE, "--hang", "--die-signal", "1:SIGKILL",
                   cwd=tmp_path)
    assert res.returncode == 128 + signal.SIGKILL
    assert "trainer 1 failed" in res.stderr and "signal SIGKILL" in res.stderr


def test_ranks_ignoring_sigterm_are_killed_after_the_grace_period(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    go = tmp_path / "go"
    proc = start_fluidctl("train", "--nproc", 2, "--grace-period", 0.5, BEHAVE, "--hang",
                          "--ignore-term", "--grandchild", "--fail-rank", 0, "--code", 9,
                          "--pidfile", pid_dir, "--wait-file", go, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 2, what="2 ranks ignoring SIGTERM")
    pids = read_pids(pid_dir, range(2))
    go.write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 9
    launch = (tmp_path / "mylog" / "launch.log").read_text()
    assert "grace period of 0.5s over: SIGKILL to trainer 1" in launch
    # the console too (issue 40.14): a checkpoint being written was lost
    assert "trainer 1 still running after the 0.5s grace period: SIGKILL" in out + err
    assert_all_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_stop_the_job(tmp_path, sig):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = start_fluidctl("train", "--nproc", 2, "--grace-period", 2, BEHAVE, "--hang",
                          "--grandchild", "--pidfile", pid_dir, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 2, what="2 ranks ready")
    pids = read_pids(pid_dir, range(2))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    assert f"{signal.Signals(sig).name} received" in out
    assert_all_gone(pids)


def test_second_ctrl_c_kills_at_once(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = start_fluidctl("train", "--nproc", 2, "--grace-period", 600, BEHAVE, "--hang",
                          "--ignore-term", "--pidfile", pid_dir, cwd=tmp_path)
    wait_for(lambda: len(list(pid_dir.glob("*.pids"))) == 2, what="2 ranks ready")
    pids = read_pids(pid_dir, range(2))
    proc.send_signal(signal.SIGINT)
    launch = tmp_path / "mylog" / "launch.log"
    wait_for(lambda: "sent SIGTERM" in launch.read_text(), what="the first stop")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)                        # would take 600 s without the kill
    assert proc.returncode == 130
    assert "second SIGINT: killing every process now" in launch.read_text()
    assert_all_gone(pids)


def test_restarts_rerun_the_group_with_the_attempt_number(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--max-restarts", 3, BEHAVE,
                   "--fail-until-restart", 2, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    log1 = (tmp_path / "mylog" / "workerlog.1").read_text()
    assert log1.count("===== fluidctl: restart") == 2
    assert "rank 1 ready restart 0" in log1 and "rank 1 ready restart 2" in log1
    assert log1.index("restart 1 of 3") < log1.index("rank 1 ready restart 1")
    assert "restarting the job (restart 2 of 3)" in res.stdout


def test_restarts_run_out(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--max-restarts", 1, BEHAVE, "--fail-rank", 1,
                   "--code", 4, cwd=tmp_path)
    assert res.returncode == 4
    assert (tmp_path / "mylog" / "workerlog.1").read_text().count("rank 1 failing") == 2


# --- logs and the console --------------------------------------------------------------------

def test_logs_hold_stdout_and_stderr_per_rank(tmp_path):
    fluidctl("train", "--nproc", 2, "--log-dir", "out/logs", BEHAVE, cwd=tmp_path, check=0)
    logs = tmp_path / "out" / "logs"
    for r in range(2):
        text = (logs / f"workerlog.{r}").read_text()
        assert f"rank {r} ready" in text and f"rank {r} to stderr" in text
    endpoints = (logs / "endpoints.log").read_text().splitlines()
    assert endpoints[0].startswith("master 127.0.0.1:") and len(endpoints) == 3
    assert "all trainers finished" in (logs / "launch.log").read_text()


def test_tee_rank0_all_none(tmp_path):
    res = fluidctl("train", "--nproc", 2, BEHAVE, cwd=tmp_path, check=0)
    assert "rank 0 ready" in res.stdout and "rank 1" not in res.stdout
    res = fluidctl("train", "--nproc", 2, "--tee", "none", BEHAVE, cwd=tmp_path, check=0)
    assert "rank" not in res.stdout
    res = fluidctl("train", "--nproc", 2, "--tee", "all", BEHAVE, cwd=tmp_path, check=0)
    assert "[trainer 0] rank 0 ready" in res.stdout
    assert "[trainer 1] rank 1 to stderr" in res.stdout


def test_echoed_lines_are_never_split_or_mixed(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--tee", "all", BEHAVE, "--lines", 20000,
                   cwd=tmp_path, check=0)
    line = re.compile(r"^\[trainer (\d)\] rank (\d) (line \d+ x{60}|ready restart 0|to stderr)$")
    lines = res.stdout.splitlines()
    assert len(lines) == 2 * 20002
    for text in lines:
        m = line.match(text)
        assert m and m.group(1) == m.group(2), text


# --- bad input: one line, exit 2, nothing started, nothing left behind ------------------------

def _busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


BAD_INPUT = TRAIN_BAD_INPUT_E2E + TRAIN_BAD_INPUT


@pytest.mark.parametrize("args,message", BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "afile").write_text("")
    busy = _busy_port()
    try:
        args = [a.format(behave=BEHAVE, busy=busy.getsockname()[1], tmp=tmp_path) for a in args]
        res = fluidctl("train", *args, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    finally:
        busy.close()
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "mylog").exists()


def test_gpu_requests_beyond_what_exists(tmp_path, fake_gpus):
    for args, message in ((["--gpus", "5"], "only 4 GPU(s) visible"),
                          (["--gpus", "0,7"], "unknown GPU id 7"),
                          (["--gpus", "0,0"], "names a GPU twice"),
                          (["--gpus", "2", "--nproc", "3"], "disagree")):
        res = fluidctl("train", *args, BEHAVE, cwd=tmp_path, env=fake_gpus)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert "--nproc" in res.stderr or "--gpus" in res.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_script(tmp_path):
    script = tmp_path / "secret.py"
    script.write_text("")
    script.chmod(0)
    res = fluidctl("train", str(script), cwd=tmp_path)
    assert res.returncode == 2 and "is not readable" in res.stderr


# --- the package itself ----------------------------------------------------------------------

def test_version_help_and_module_entry(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fluidctl", "--version"], capture_output=True,
                         text=True, check=True)
    assert re.match(r"fluidctl, version \d+\.\d+\.\d+", res.stdout)
    res = fluidctl("--help", cwd=tmp_path, check=0)
    assert "train" in res.stdout and "_FLUIDCTL_COMPLETE" in res.stdout
    res = fluidctl("train", "--help", cwd=tmp_path, check=0)
    assert "--nproc-per-node" in res.stdout and "Examples" in res.stdout


def test_shell_completion_script(tmp_path):
    env = dict(os.environ, _FLUIDCTL_COMPLETE="bash_source")
    res = subprocess.run([sys.executable, "-m", "fluidctl"], env=env, capture_output=True,
                         text=True)
    assert "complete" in res.stdout and "_FLUIDCTL_COMPLETE" in res.stdout
