"""``fluidctl train --backend slurm`` against the REAL Slurm of tests/slurm.py: inside an
allocation (one srun step), and from outside (sbatch, record, follow), plus bad input."""
import importlib.util
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest


from launchutil import BEHAVE, ROOT, default_sigint, TEMPLATES, alive, read_pids, wait_for

SCRIPTS = ROOT / "tests" / "scripts"

SHOW = """
import json, os
print("CONTRACT " + json.dumps({k: v for k, v in os.environ.items()
      if k.startswith(("PADDLE_", "FLAGS_", "MASTER_", "SLURMD_"))
      or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TRAINING_ROLE")}), flush=True)
"""


def fluidctl(slurm, tmp_path, *args, env=None, timeout=120):
    full = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def start_fluidctl(slurm, tmp_path, *args, env=None):
    full = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "fluidctl", *map(str, args)], env=full,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)


# --- inside an allocation --------------------------------------------------------------------
def test_inside_allocation_two_nodes_two_ranks(slurm, tmp_path):
    """The Paddle contract on 2 nodes x 2 ranks, one srun step, workerlog.N per rank."""
    alloc = slurm.allocate(2, 2)
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--tee", "all", script,
                   env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    got = sorted((json.loads(m) for m in re.findall(r"CONTRACT (.*)", res.stdout)),
                 key=lambda c: int(c["RANK"]))
    assert [c["PADDLE_TRAINER_ID"] for c in got] == ["0", "1", "2", "3"]
    eps = got[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert [e.rsplit(":", 1)[0] for e in eps] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2
    for c in got:
        rank = int(c["RANK"])
        assert c["SLURMD_NODENAME"] == eps[rank].rsplit(":", 1)[0]
        assert c["PADDLE_CURRENT_ENDPOINT"] == eps[rank] and c["WORLD_SIZE"] == "4"
        assert c["MASTER_ADDR"] == "127.0.0.2" and c["PADDLE_LOCAL_RANK"] == str(rank % 2)
    for rank in range(4):
        assert "CONTRACT" in (tmp_path / "mylog" / f"workerlog.{rank}").read_text()
    assert "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=4" in (
        tmp_path / "mylog" / "launch.log").read_text()
    assert slurm.steps(alloc["SLURM_JOB_ID"]) == []


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_unmodified_torch_ddp_script_inside_allocation(slurm, tmp_path):
    alloc = slurm.allocate(2, 2)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--tee", "all",
                   SCRIPTS / "torch_ddp.py", env=alloc, timeout=300)
    if res.returncode != 0:     # torch 2.13's known abort in gloo's exit handlers (README)
        assert res.returncode == 134, res.stdout + res.stderr
    found = re.findall(r"\[trainer (\d)\] torch rank (\d)/4 .*allreduce 10\.0 weights (\[.*\])",
                       res.stdout)
    assert sorted((a, b) for a, b, _ in found) == [(str(r), str(r)) for r in range(4)], \
        res.stdout
    assert len({w for _, _, w in found}) == 1


def test_runtime_allreduce_across_nodes_under_the_backend(slurm, tmp_path):
    alloc = slurm.allocate(2, 2)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--tee", "all",
                   ROOT / "tests" / "runtime_worker.py", "ops", env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    results = [json.loads(m) for m in re.findall(r"RESULT (.*)", res.stdout)]
    assert len(results) == 4 and all(r["transport"] == "hierarchical" for r in results)
    assert all(r["big"] and r["sum_float32"] and r["allgather"] for r in results)


NODE_JOIN = """
import json, numpy
from fluidctl import runtime
ctx = runtime.init(timeout=60)
total = ctx.allreduce(numpy.array([float(ctx.env.rank)]))
joins = ctx._server.requests.get("join") if ctx._server else None
print("JOINED " + json.dumps({"rank": ctx.env.rank, "sum": float(total[0]), "joins": joins,
                             "through_node": bool(ctx.env.node_join)}), flush=True)
runtime.finalize()
"""


def test_each_nodes_first_task_joins_the_store_for_its_node(slurm, tmp_path):
    """Under srun no agent starts the ranks: the node's first task serves its node's join, so
    rank 0's store gets one join per node (2), not one per rank (4), and the ranks reduce."""
    alloc = slurm.allocate(2, 2)
    (tmp_path / "join.py").write_text(NODE_JOIN)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--tee", "all", "join.py",
                   env=alloc)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = sorted((json.loads(m) for m in re.findall(r"JOINED (.*)", res.stdout)),
                  key=lambda r: r["rank"])
    assert [r["sum"] for r in seen] == [6.0] * 4, res.stdout
    assert all(r["through_node"] for r in seen), seen
    assert seen[0]["joins"] == 2, seen


def test_dry_run_inside_allocation_shows_the_step(slurm, tmp_path):
    alloc = slurm.allocate(2, 2)
    (tmp_path / "x.py").write_text("")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--dry-run", "--json",
                   "--slurm-arg=--cpu-bind=none", "x.py", "--lr", 1, env=alloc)
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["backend"] == "slurm"
    assert shown["commands"][0]["host"] == f"allocation {alloc['SLURM_JOB_ID']}"
    argv = shown["commands"][0]["argv"]
    assert argv[:5] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=4",
                        "--ntasks-per-node=2"]
    assert argv[-8:] == ["--cpu-bind=none", sys.executable, "-m", "fluidctl", "worker",
                         str(tmp_path / "x.py"), "--lr", "1"]
    assert [(p["rank"], p["host"], p["local_rank"], Path(p["log"]).name)
            for p in shown["procs"]] == [
        (0, "127.0.0.2", 0, "workerlog.0"), (1, "127.0.0.2", 1, "workerlog.1"),
        (2, "127.0.0.3", 0, "workerlog.2"), (3, "127.0.0.3", 1, "workerlog.3")]
    assert shown["procs"][0]["env"]["FLUIDCTL_WORKER_ECHO"] == "0"
    assert not (tmp_path / "mylog").exists()


def test_failing_rank_ends_the_step_with_its_code_and_host(slurm, tmp_path):
    alloc = slurm.allocate(2, 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", BEHAVE, "--pidfile", pids,
                   "--fail-rank", 3, "--code", 7, "--hang", env=alloc)
    assert res.returncode == 7, res.stdout + res.stderr
    assert re.search(r"trainer 3 .*127\.0\.0\.3", res.stderr), res.stderr
    assert "rank 3 failing with 7" in res.stderr           # the tail of its workerlog
    # --kill-on-bad-exit=1: every other rank was stopped too, on both nodes (a rank killed
    # before it wrote its pid file is stopped as well: rank 3 fails at once, and under load
    # the step can end before the other ranks reached their first line)
    started = [r for r in range(4) if (pids / f"{r}.pids").exists()]
    assert 3 in started
    assert not any(alive(p) for p in read_pids(pids, started))
    assert slurm.steps(alloc["SLURM_JOB_ID"]) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_cancels_the_step_everywhere(slurm, tmp_path, sig, code):
    alloc = slurm.allocate(2, 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = start_fluidctl(slurm, tmp_path, "train", "--backend", "slurm", BEHAVE, "--pidfile",
                          pids, "--hang", env=alloc)
    try:
        wait_for(lambda: len(list(pids.glob("*.pids"))) == 4, timeout=60, what="4 ranks")
        ranks = read_pids(pids, [0, 1, 2, 3])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out + err
    wait_for(lambda: not any(alive(p) for p in ranks), timeout=30, what="ranks gone")
    wait_for(lambda: slurm.steps(alloc["SLURM_JOB_ID"]) == [], timeout=30, what="no step")


def test_pserver_mode_inside_allocation(slurm, tmp_path):
    alloc = slurm.allocate(2, 1)
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--mode", "pserver",
                   "--pservers", 2, "--tee", "all", TEMPLATES / "train_pserver.py", "--steps", 40,
                   env=alloc, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"\[trainer 0\] .*step 39", res.stdout), res.stdout
    assert re.search(r"\[trainer 1\] .*step 39", res.stdout), res.stdout
    for i in range(2):
        assert (tmp_path / "mylog" / f"serverlog.{i}").exists()
    wait_for(lambda: slurm.steps(alloc["SLURM_JOB_ID"]) == [], timeout=30, what="no step")


# --- outside an allocation: sbatch ---------------------------------------------------------
def test_sbatch_submit_follow_and_exit_code(slurm, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW + "import sys, os\nsys.exit(5 if os.environ['RANK'] == '2' else 0)\n")
    dry = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--nproc", 2,
                   "--partition", slurm.partition, "--time", "5:00", "--dry-run", script)
    assert dry.returncode == 0, dry.stderr
    script_text = dry.stdout[dry.stdout.index("#!/bin/bash\n"):]
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" in script_text
    assert "sbatch --parsable" in dry.stdout
    assert not (tmp_path / "mylog").exists()                  # --dry-run writes nothing
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--nproc", 2,
                   "--partition", slurm.partition, "--time", "5:00", "--tee", "all", script)
    assert res.returncode == 5, res.stdout + res.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", res.stderr).group(1)
    assert re.search(r"trainer 2 .*127\.0\.0\.3", res.stderr), res.stderr
    assert (tmp_path / "mylog" / f"slurm-{job_id}.sbatch").read_text() == script_text
    assert (tmp_path / "mylog" / f"slurm-{job_id}" / "workerlog.2").exists()
    assert "[trainer 2] CONTRACT" in res.stdout        # echoed from its workerlog.2
    status = json.loads(fluidctl(slurm, tmp_path, "job", "status", job_id, "--json").stdout)
    assert (status["state"], status["exit_code"]) == ("FAILED", 5)


def test_two_submissions_from_one_directory_keep_their_own_logs(slurm, tmp_path):
    """Issue 25.4: two --detach jobs from one directory (default mylog/): each has its own
    script and log dir (mylog/slurm-JOBID/), `job logs N` shows N's, and `job status` of the
    failed one says why."""
    script = tmp_path / "which.py"
    script.write_text("import os, sys\nprint('I am job', os.environ['SLURM_JOB_ID'], flush=True)\n"
                      "if sys.argv[1] == 'fail':\n    raise ValueError('bad learning rate')\n")
    ids = []
    for how in ("ok", "fail"):
        res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1,
                       "--detach", script, how)
        assert res.returncode == 0, res.stderr
        ids.append(re.search(r"submitted Slurm job (\d+)", res.stderr).group(1))
    for job_id in ids:
        slurm.wait_gone(job_id)
    first, second = ids
    for job_id in ids:
        assert (tmp_path / "mylog" / f"slurm-{job_id}.sbatch").is_file()
        shown = fluidctl(slurm, tmp_path, "job", "logs", job_id)
        assert shown.stdout.startswith(f"I am job {job_id}\n"), shown.stdout + shown.stderr
    ok = fluidctl(slurm, tmp_path, "job", "status", first)
    assert ok.returncode == 0 and "why:" not in ok.stdout, ok.stdout
    failed = fluidctl(slurm, tmp_path, "job", "status", second)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert (f"why: trainer 0 on 127.0.0.2 exited with code 1: ValueError: bad learning rate "
            f"(at which.py:4) (log {tmp_path / 'mylog' / f'slurm-{second}' / 'workerlog.0'})"
            ) in failed.stdout, failed.stdout
    row = json.loads(fluidctl(slurm, tmp_path, "job", "status", second, "--json").stdout)
    assert "ValueError: bad learning rate" in row["why"]


def test_an_error_before_the_script_is_quoted_in_the_report(slurm, tmp_path):
    """Issue 25.6: rank 0's worker refuses before the script (and its log) starts; the report
    quotes its one line from srun.log instead of 'exit code 2 (no traceback in its log)'."""
    import socket
    script = tmp_path / "t.py"
    script.write_text("print('never')\n")
    alloc = slurm.allocate(2, 1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", script,
                       env={**alloc, "MASTER_PORT": str(port)})
    assert res.returncode == 2, res.stdout + res.stderr
    flat = " ".join(res.stderr.split())
    assert f"error: master port {port} on 127.0.0.2 (127.0.0.2) is not usable" in flat, flat
    assert "no traceback in its log" not in flat


def test_25_8_ctrl_c_while_following_says_the_job_keeps_running(slurm, tmp_path):
    """Ctrl-C while following a submitted job (train, then 'job logs -f'): one honest line
    (the job keeps running, how to cancel it), not "SIGINT received, stopping all processes";
    the job does keep running."""
    import select
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = start_fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1,
                          BEHAVE, "--pidfile", pids, "--lines", 1, "--hang")
    try:
        wait_for(lambda: list(pids.glob("*.pids")), timeout=60, what="the rank to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    job_id = re.search(r"submitted Slurm job (\d+)", err).group(1)
    honest = (f"fluidctl: stopped following job {job_id}; the job keeps running in Slurm "
              f"('fluidctl job cancel {job_id}' cancels it, 'fluidctl job logs {job_id} -f' "
              "follows it again)")
    assert proc.returncode == 130 and honest in err.splitlines(), err
    assert "stopping" not in err and "SIGINT" not in err, err
    assert all(alive(p) for p in read_pids(pids, [0]))        # the job keeps running
    follower = start_fluidctl(slurm, tmp_path, "job", "logs", job_id, "--follow")
    try:
        ready, _, _ = select.select([follower.stdout], [], [], 60)
        assert ready and follower.stdout.readline()             # following: rank 0's line
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 130 and err.splitlines() == [honest], err
    assert all(alive(p) for p in read_pids(pids, [0]))
    assert fluidctl(slurm, tmp_path, "job", "cancel", job_id).returncode == 0
    slurm.wait_gone(job_id)


def test_sbatch_detach_then_cancel(slurm, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--nproc", 1,
                   "--detach", BEHAVE, "--pidfile", pids, "--hang")
    assert res.returncode == 0, res.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", res.stderr).group(1)
    assert f"fluidctl job cancel {job_id}" in res.stderr
    wait_for(lambda: len(list(pids.glob("*.pids"))) == 2, timeout=60, what="2 ranks")
    ranks = read_pids(pids, [0, 1])
    listed = json.loads(fluidctl(slurm, tmp_path, "job", "list", "--json").stdout)
    assert [(j["job_id"], j["state"]) for j in listed] == [(job_id, "RUNNING")]
    assert fluidctl(slurm, tmp_path, "job", "cancel", job_id).returncode == 0
    wait_for(lambda: not any(alive(p) for p in ranks), timeout=30, what="ranks gone")
    slurm.wait_gone(job_id)


# --- bad input: one line, exit 2 -----------------------------------------------------------
def test_bad_input(slurm, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    one = slurm.allocate(1, 1)
    cases = [
        ({}, ["--backend", "slurm", script], "not in a Slurm allocation"),
        ({}, ["--backend", "slurm", "--nodes", 1, "--partition", "nope", script],
         "sbatch refused the job"),
        ({"PATH": "/nonexistent"}, ["--backend", "slurm", "--nodes", 1, script],
         "Slurm's sbatch is not installed"),
        (one, ["--backend", "slurm", "--nodes", 3, script], "--nodes 3 but allocation"),
        ({**one, "SLURM_GPUS_ON_NODE": "1"}, ["--backend", "slurm", "--gpus", 2, script],
         "--gpus 2 asks for 2 GPU(s) per node, but allocation"),
        (slurm.allocate(2, 2), ["--backend", "slurm", "--nproc", 8, "--log-dir",
                                tmp_path / "cpus", script],
         "8 rank(s) per node need 8 CPU(s), but allocation"),
        ({}, ["--nodes", 2, script], "the job runs on this machine alone"),
        # issue 25.5: not ignored inside a CPU-only allocation
        (one, ["--backend", "slurm", "--gpus", 1, script],
         "--gpus 1 but allocation %s has no GPUs" % one["SLURM_JOB_ID"]),
        (one, ["--backend", "slurm", "--partition", "gpu", script],
         "--partition gpu applies to a new job, but this runs inside allocation"),
        (one, ["--backend", "slurm", "--time", "5:00", script],
         "--time 5:00 applies to a new job"),
    ]
    said = {}
    for env, args, what in cases:
        res = fluidctl(slurm, tmp_path, "train", *args, env=env)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stderr.startswith("error: ") and what in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        said[what] = res.stderr
    # the CPU check: Slurm's own numbers and a fix to type, before anything started
    assert re.match(r"error: 8 rank\(s\) per node need 8 CPU\(s\), but allocation \d+ has 2 on "
                    r"127\.0\.0\.2 \(SLURM_JOB_CPUS_PER_NODE=2\(x2\)\) \(run at most 2 per node "
                    r"\(--nproc 2\), or allocate more CPUs, e\.g\. salloc -N 2 "
                    r"--ntasks-per-node 8\)$", said["8 rank(s) per node need 8 CPU(s), but "
                                                    "allocation"].strip())
    assert not (tmp_path / "cpus" / "srun.log").exists()


def test_what_srun_lets_overcommit_is_not_refused(slurm, tmp_path):
    """The CPU check stands aside where srun may overcommit: --slurm-arg options of the
    user's own (here --overcommit), and the 8 ranks on 2 CPUs per node then run."""
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nproc", 8,
                   "--slurm-arg=--overcommit", "--log-dir", tmp_path / "log", script,
                   env=slurm.allocate(2, 2))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "log").glob("workerlog.*")) == sorted(
        f"workerlog.{r}" for r in range(16))


# --- hang autopsy and fluidctl dump inside an allocation ---------------------------------------
TROUBLE = ROOT / "tests" / "scripts" / "trouble.py"


def _line_of(code: str) -> int:
    (n,) = [i for i, l in enumerate(TROUBLE.read_text().splitlines(), 1) if code in l]
    return n


@pytest.mark.parametrize("pyspy", [True, False], ids=["py-spy", "faulthandler"])
def test_a_hang_inside_an_allocation_is_diagnosed_on_every_node(slurm, tmp_path, pyspy):
    """Rank 1 never reaches the allreduce ranks 0, 2 and 3 wait in: after --hang-timeout the
    launcher has every rank's stack taken on its own node (an overlapping srun step), prints
    who waits where, writes the hang directory and failure.json, cancels the step, exits 124."""
    from fluidctl.diagnostics import stacks
    if pyspy and not stacks.pyspy_path():
        pytest.skip("py-spy not installed (pip install 'fluidctl[debug]')")
    alloc = slurm.allocate(2, 2)
    env = dict(alloc, **({} if pyspy else {"FLUIDCTL_PYSPY": ""}))
    log = tmp_path / "log"
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--hang-timeout", 5,
                   "--log-dir", log, TROUBLE, "stuck", env=env, timeout=180)
    assert res.returncode == 124, res.stdout + res.stderr
    err = res.stderr
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert re.search(r"fluidctl: the job hung: slow data: rank 1 on 127\.0\.0\.2 is in its data "
                     rf"loader \(load_batch at trouble\.py:{_line_of('time.sleep(3600)')}, \d% "
                     rf"CPU\); ranks 0,2,3 wait in allreduce #2 \(trouble\.py:"
                     rf"{_line_of('# stuck')}\)", err), err
    assert "  no rank wrote to its log and no collective completed for 5s" in err
    assert f"ranks 0,2,3 wait in allreduce at trouble.py:{_line_of('# stuck')}" in err, err
    assert f"rank 1 is in load_batch at trouble.py:{_line_of('time.sleep(3600)')}" in err, err
    (where,) = list(log.glob("hang-*"))
    method = "py-spy" if pyspy else "faulthandler"
    for rank, node in ((0, "127.0.0.2"), (1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.3")):
        text = (where / f"rank-{rank}.txt").read_text()
        assert text.startswith(f"# rank {rank} on {node}, taken with {method}"), text[:200]
    assert "load_batch" in (where / "rank-1.txt").read_text()
    report = json.loads((log / "failure.json").read_text())
    assert report["exit_code"] == 124
    assert report["hang"]["summary"][0].startswith("ranks 0,2,3 wait in allreduce")
    wait_for(lambda: slurm.steps(alloc["SLURM_JOB_ID"]) == [], timeout=30, what="no step")
    assert not list(log.glob(".fluidctl_diag.*"))          # the shared diagnostics dir is gone


def test_fluidctl_dump_inside_an_allocation_leaves_the_job_running(slurm, tmp_path):
    """fluidctl dump (SIGUSR1 to the launcher) takes the stacks of a Slurm job's ranks the
    same way, signalling the rank processes only: the job goes on, and ends when stopped."""
    alloc = slurm.allocate(2, 1)
    log = tmp_path / "log"
    job = start_fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--log-dir", log,
                         TROUBLE, "wait", env=alloc)
    try:
        wait_for(lambda: all((log / f"workerlog.{r}").exists()
                             and "ready" in (log / f"workerlog.{r}").read_text()
                             for r in range(2)) and (log / "job.json").exists(),
                 timeout=60, what="both ranks ready")
        out = fluidctl(slurm, tmp_path, "dump", "--log-dir", log, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        idle = _line_of("time.sleep(0.5)")
        assert f"ranks 0,1 are in idle at trouble.py:{idle}" in out.stdout, out.stdout
        (where,) = list(log.glob("dump-*"))
        assert (where / "rank-1.txt").read_text().startswith("# rank 1 on 127.0.0.3")
        assert job.poll() is None                              # the job goes on
        assert len(slurm.steps(alloc["SLURM_JOB_ID"])) == 1    # the stack step has ended
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    assert job.returncode == 143


def test_a_submitted_job_watches_for_hangs_in_its_own_allocation(slurm, tmp_path):
    """From a login node, --hang-timeout goes into the batch script: the job's own fluidctl
    diagnoses the hang and ends with 124, which the follower exits with."""
    log = tmp_path / "log"
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 2, "--nproc", 2,
                   "--partition", slurm.partition, "--time", "5:00", "--hang-timeout", 5,
                   "--log-dir", log, TROUBLE, "stuck", timeout=240)
    assert res.returncode == 124, res.stdout + res.stderr
    (script,) = list(log.glob("slurm-*.sbatch"))
    assert " --hang-timeout 5 " in script.read_text()
    log = log / script.stem                                   # the job's own: slurm-JOBID/
    (where,) = list(log.glob("hang-*"))
    loader = f"rank 1 is in load_batch at trouble.py:{_line_of('time.sleep(3600)')}"
    assert loader in (where / "summary.txt").read_text()
    # the follower names the hang and shows the end of the batch output, the job's summary
    flat = " ".join(res.stderr.split())              # the report wraps long lines
    assert (f"failed on slurm: hung: no rank wrote to its log and no collective completed for "
            f"5s; every rank's stack: {where}") in flat, res.stderr
    assert f"|   {loader}" in res.stderr
    # failure.json is the batch job's own (the follower leaves it and job.json alone)
    assert json.loads((log / "failure.json").read_text())["hang"]["dir"] == str(where)
    assert not (log / "job.json").exists()
