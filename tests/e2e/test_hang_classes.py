"""Each class of hang and collective failure injected into a real job on this machine, and the
sentence fluidctl prints first: a fluidctl.runtime script (tests/scripts/trouble.py), an
unmodified torch DDP gloo script (tests/scripts/torch_hang.py) and an unmodified Paddle
DataParallel gloo script (tests/scripts/paddle_hang.py). The jobs of one test run side
by side (each waits out its own --hang-timeout). The slow-data class (a rank in its data
loader) is asserted in test_diagnose.py and in the Slurm and ssh tests in tests/cluster."""
import json
import re

import pytest

from launchutil import ROOT, start_fluidctl, torch_exit_ok
from troubleutil import TROUBLE, classified_after, line_of

TORCH_HANG = ROOT / "tests" / "scripts" / "torch_hang.py"
PADDLE_HANG = ROOT / "tests" / "scripts" / "paddle_hang.py"
GLOO_MISMATCH = ROOT / "tests" / "scripts" / "gloo_mismatch.py"
TIMEOUT = 3
CLASSIFIED_WITHIN = 10.0          # seconds from the hang's detection to its sentence


def run_all(tmp_path, script, scenarios, nproc, envs=None, watch=True):
    """Start one job per scenario (or per ``envs`` name: scenario, environment), all at once,
    with --hang-timeout unless not ``watch``; (returncode, stderr, log dir) per scenario."""
    jobs = {}
    hang = ["--hang-timeout", TIMEOUT] if watch else []
    for name, (scenario, env) in (envs or {n: (n, None) for n in scenarios}).items():
        log = tmp_path / name
        jobs[name] = (start_fluidctl("train", "--nproc", nproc, *hang, "--log-dir", log, script,
                                     scenario, cwd=tmp_path, env=env), log)
    done = {}
    for name, (proc, log) in jobs.items():
        try:
            _, err = proc.communicate(timeout=240)
        finally:
            proc.kill()
        done[name] = (proc.returncode, err, log)
    return done


def hang_record(log):
    return json.loads((log / "failure.json").read_text())["hang"]


def needs_pyspy():
    from fluidctl.diagnostics import stacks
    if not stacks.pyspy_path():
        pytest.skip("py-spy not installed (pip install 'fluidctl[debug]')")


def source_line(script, text) -> int:
    return 1 + next(i for i, l in enumerate(script.read_text().splitlines()) if text in l)


def test_runtime_script_each_class(tmp_path):
    waits = line_of("ctx.allreduce(x)  # waits")
    done = run_all(tmp_path, TROUBLE, ["spin", "stop", "skip", "desync", "mismatch",
                                       "compute"], 2)
    code, err, log = done.pop("compute")       # every rank busy, none waiting: no hang
    assert code == 0 and "hung" not in err, err
    assert "every rank is busy and none waits" in (log / "launch.log").read_text()
    for name in ("spin", "stop", "skip"):
        code, err, log = done[name]
        assert code == 124, (name, err)
        assert "Traceback" not in err, err
        assert classified_after(log) <= CLASSIFIED_WITHIN
        assert f"rank 0 waits in allreduce #2 (trouble.py:{waits})" in err, err
        assert "  no rank wrote to its log and no collective completed for 3s" in err
        assert list(log.glob("hang-*/rank-1.txt")), name       # the stacks stay in LOG_DIR
    code, err, log = done["spin"]
    spin = f"({line_of('a step that never ends')}|{line_of('n += 1')})"   # a sample's line
    assert re.search(r"fluidctl: the job hung: slow compute: rank 1 on 127\.0\.0\.1 is busy in "
                     rf"user code \(spin at trouble\.py:{spin}, \d+% CPU", err), err
    assert hang_record(log)["class"] == "slow compute" and hang_record(log)["ranks"] == [1]
    code, err, log = done["stop"]
    assert ("fluidctl: the job hung: dead peer: rank 1 on 127.0.0.1 is stopped (SIGSTOP or a "
            "frozen cgroup); rank 0 waits in allreduce #2") in err, err
    states = [e["state"] for e in hang_record(log)["evidence"]]
    # rank 1 stopped; rank 0 waits (its waiter may be sampled on a core: R under load)
    assert states[1] == "T" and states[0] in ("S", "R"), states
    code, err, log = done["skip"]
    assert re.search(r"fluidctl: the job hung: desync: rank 1 on 127\.0\.0\.1 never reached "
                     rf"allreduce #2 \(trouble\.py:{waits}\): is idle outside any collective "
                     rf"\(idle at trouble\.py:{line_of('time.sleep(0.5)')}, \d% CPU\)", err), err
    code, err, log = done["desync"]
    assert code == 1
    assert ("why: desync: collective #2: rank 0 called allreduce but rank 1 called broadcast; "
            "every rank must make the same collective calls in the same order (at trouble.py:"
            ) in err, err
    assert json.loads((log / "failure.json").read_text())["first_failure"]["kind"] == "desync"
    code, err, log = done["mismatch"]
    assert code == 1
    assert ("why: mismatch: allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 shape "
            f"(5,) (at trouble.py:{line_of('# mismatched')})") in err, err


def test_unmodified_torch_ddp_script_desync_and_dead_peer(tmp_path):
    """Beside the two faults, a healthy torch job that prints nothing for longer than the
    timeout: its stack samples move, so it is no hang (without py-spy it would be one)."""
    pytest.importorskip("torch")
    needs_pyspy()
    forward = source_line(TORCH_HANG, "model(x).sum().backward()")
    barrier = source_line(TORCH_HANG, "dist.barrier()")
    done = run_all(tmp_path, TORCH_HANG, ["uneven", "stop", "quiet"], 2)
    code, err, log = done.pop("quiet")
    assert torch_exit_ok(code, err) and "hung" not in err, err     # gloo's exit abort is torch's
    for name, (code, err, log) in done.items():
        assert code == 124, (name, err)
        assert classified_after(log) <= CLASSIFIED_WITHIN
    code, err, log = done["uneven"]
    assert (f"fluidctl: the job hung: desync: rank 0 waits in DDP forward (torch_hang.py:"
            f"{forward}); rank 1 waits in barrier (torch_hang.py:{barrier}) on 127.0.0.1") in err, err
    assert hang_record(log)["class"] == "desync" and hang_record(log)["ranks"] == [1]
    # torch's own records (its Flight Recorder), aligned by collective number
    assert re.search(r"collective #\d+ differs between ranks: rank 0 called broadcast "
                     r"\(\[3\] int\); rank 1 called barrier", err), err
    code, err, log = done["stop"]
    assert ("fluidctl: the job hung: dead peer: rank 1 on 127.0.0.1 is stopped (SIGSTOP or a "
            f"frozen cgroup); rank 0 waits in DDP forward (torch_hang.py:{forward})") in err, err
    assert re.search(r"torch's collective records, each rank's last: rank 0 #\d+ broadcast "
                     r"\(\[3\] int\), not finished\n", err), err     # rank 1 cannot answer


def test_torch_collectives_count_as_progress_without_pyspy(tmp_path):
    """Without py-spy there are no stack samples: a healthy torch job that prints nothing for
    longer than the timeout still makes progress, through its step marks (the Flight
    Recorder's collective numbers in its steps page) and, before its first collective (torch's
    import on a crowded machine), the CPU time its ranks use, and is no hang."""
    pytest.importorskip("torch")
    from pace import hang_timeout
    # silent for longer than the timeout, which outlasts torch's start-up here and now (a
    # 3 s timeout ran out while a crowded machine was still importing torch: no marks yet)
    timeout = hang_timeout(TIMEOUT)
    proc = start_fluidctl("train", "--nproc", 2, "--hang-timeout", timeout, "--log-dir",
                          tmp_path / "quiet", TORCH_HANG, "quiet", timeout + 3, cwd=tmp_path,
                          env={"FLUIDCTL_PYSPY": ""})
    try:
        _, err = proc.communicate(timeout=300 + 3 * timeout)
    finally:
        proc.kill()
    assert torch_exit_ok(proc.returncode, err) and "hung" not in err, err


def first_failure(log):
    return json.loads((log / "failure.json").read_text())["first_failure"]


def test_unmodified_torch_script_gloo_size_mismatch(tmp_path):
    """gloo does not hang on a size mismatch: it aborts the rank that receives the odd message.
    Plain, that rank's log has only gloo's byte counts; with torch's DETAIL check every rank
    names its own shape, and the report puts them together."""
    pytest.importorskip("torch")
    done = run_all(tmp_path, GLOO_MISMATCH, (), 3, envs={
        "plain": ("torch", None),
        "detail": ("torch", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})}, watch=False)
    code, err, log = done["plain"]
    assert code == 134 and "hung" not in err, err
    assert re.search(r"why: mismatch: rank \d received a \d+-byte message from a peer where its "
                     r"collective expected \d+ bytes, and gloo aborted it", err), err
    assert first_failure(log)["kind"] == "mismatch"
    code, err, log = done["detail"]
    assert code == 1, err
    assert ("why: mismatch: rank 1 called all_reduce with 1024 floats, ranks 0,2 with 512 floats "
            "(torch's collective check, TORCH_DISTRIBUTED_DEBUG=DETAIL)") in err, err
    assert first_failure(log)["kind"] == "mismatch"


def test_unmodified_paddle_script_gloo_size_mismatch(tmp_path):
    """Paddle's gloo aborts the same way (its own line, without torch's hint)."""
    pytest.importorskip("paddle")
    (code, err, log), = run_all(tmp_path, GLOO_MISMATCH, ["paddle"], 2, watch=False).values()
    assert code == 134 and "hung" not in err, err
    assert re.search(r"why: mismatch: rank 0 received a 1024-byte message from a peer where its "
                     r"collective expected 512 bytes, and gloo aborted it", err), err
    assert "TORCH_DISTRIBUTED_DEBUG" not in err


def test_unmodified_paddle_script_dead_peer_and_desync(tmp_path):
    """Paddle's DataParallel moves its gradients inside Tensor.backward on the main thread:
    a rank waiting there waits in a collective."""
    pytest.importorskip("paddle")
    needs_pyspy()
    backward = source_line(PADDLE_HANG, "loss.backward()")
    reduce = source_line(PADDLE_HANG, "dist.all_reduce(loss)")
    wait = source_line(PADDLE_HANG, "time.sleep(0.5)")
    done = run_all(tmp_path, PADDLE_HANG, ["stop", "skip"], 2)
    for name, (code, err, log) in done.items():
        assert code == 124, (name, err)
        assert classified_after(log) <= CLASSIFIED_WITHIN
    code, err, log = done["stop"]
    assert ("fluidctl: the job hung: dead peer: rank 1 on 127.0.0.1 is stopped (SIGSTOP or a "
            f"frozen cgroup); rank 0 waits in backward (paddle_hang.py:{backward})") in err, err
    assert hang_record(log)["class"] == "dead peer" and hang_record(log)["ranks"] == [1]
    code, err, log = done["skip"]
    assert re.search(r"fluidctl: the job hung: desync: rank 1 on 127\.0\.0\.1 never reached "
                     rf"all_reduce \(paddle_hang\.py:{reduce}\): is idle outside any collective "
                     rf"\(<module> at paddle_hang\.py:{wait}, \d% CPU\); rank 0 waits in "
                     rf"all_reduce \(paddle_hang\.py:{reduce}\)", err), err
    assert hang_record(log)["class"] == "desync" and hang_record(log)["ranks"] == [1]


@pytest.mark.usefixtures("openmpi")
def test_under_mpirun_a_script_without_fluidctl_answers_the_stack_signal(tmp_path):
    """--backend mpi without py-spy: each rank's fluidctl worker answers the stack signal into
    the shared LOG_DIR, so a script that never imports fluidctl.runtime is classified too."""
    script = ROOT / "tests" / "scripts" / "plain_hang.py"
    proc = start_fluidctl("train", "--backend", "mpi", "--nproc", 2, "--hang-timeout", TIMEOUT,
                          "--log-dir", tmp_path / "log", script, cwd=tmp_path,
                          env={"FLUIDCTL_PYSPY": ""})
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 124, err
    read = 1 + next(i for i, l in enumerate(script.read_text().splitlines())
                    if "never answers" in l)
    assert re.search(r"fluidctl: the job hung: slow data: rank 1 on \S+ is in its data loader "
                     rf"\(read_batch at plain_hang\.py:{read}, \d% CPU\)", err), err
    assert hang_record(tmp_path / "log")["evidence"][1]["state"] == "S"
    (stack,) = (tmp_path / "log").glob("hang-*/rank-1.txt")
    assert "taken with faulthandler" in stack.read_text()
