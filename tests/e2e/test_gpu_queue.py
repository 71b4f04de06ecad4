"""GPU collectives queued like torch's, against the strict CuPy/NCCL double: the metadata agreed
in full on a signature's first use and by hash after, the watchdog's sticky faults and
deadline, back-pressure and synchronize (issue 38)."""
import json

import pytest

from test_runtime_gpu import gpu_ranks, results


def lines(res):
    """Every RESULT line of every rank, in order."""
    return [[json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]
            for text in res.outputs]

STRICT = "(set FLUIDCTL_STRICT_COLLECTIVES=1 to check every call as it is made)"


@pytest.mark.parametrize("arrays,want", [
    (["A", "C"], "allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 shape (5,)"),
    (["A", "D"], "allreduce: dtype mismatch: rank 0 passed float32, rank 1 passed float64"),
])
def test_a_mismatch_at_first_use_is_named_as_before(arrays, want, tmp_path):
    res = gpu_ranks(2, tmp_path, ["mismatch", "first", *arrays])
    assert {o[0]["error"] for o in lines(res)} == {want}, res


@pytest.mark.parametrize("arrays,want", [
    (["A", "B"], "allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 shape (6,)"),
    (["A", "D"], "allreduce: dtype mismatch: rank 0 passed float32, rank 1 passed float64"),
    # rank 1's call is new to it (it agrees in full) while rank 0 hashes a known one
    (["A", "C"], "allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 shape (5,)"),
])
def test_a_mismatch_after_the_hash_phase_names_the_first_diverging_call(arrays, want,
                                                                        tmp_path):
    res = gpu_ranks(2, tmp_path, ["mismatch", "hashed", *arrays], timeout=60)
    outs = lines(res)
    errors = [o[0]["error"] for o in outs]
    assert errors[0] == errors[1], res
    # warm-up: 9 calls, then the 10th diverges
    assert errors[0].startswith(f"the ranks' GPU collective calls diverged at collective #10: "
                                f"{want} {STRICT}"), errors[0]
    assert all(o[1]["after"] and o[1]["after"].startswith(errors[0]) for o in outs), outs


def test_a_mismatch_after_the_hash_phase_is_found_where_a_checkpoint_is_agreed(tmp_path):
    res = gpu_ranks(2, tmp_path, ["mismatch", "hashed", "A", "B", "checkpoint"],
                    extra={"FLUIDCTL_CHECKPOINT_REQUEST": str(tmp_path / "request")})
    errors = {o[0]["error"] for o in lines(res)}
    assert len(errors) == 1, res
    assert errors.pop().startswith("the ranks' GPU collective calls diverged at collective "
                                   "#10: allreduce: shape mismatch")


def test_strict_collectives_checks_every_call(tmp_path):
    res = gpu_ranks(2, tmp_path, ["mismatch", "hashed", "A", "B"],
                    extra={"FLUIDCTL_STRICT_COLLECTIVES": "1"})
    errors = {o[0]["error"] for o in lines(res)}
    assert errors == {"allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 shape (6,)"}


def sticky_errors_agree(outs) -> str:
    """Every rank: from its first failing call on, every call failed with one message, the
    same on every rank, and no later than synchronize. Returns the message."""
    messages = set()
    for out in outs:
        errors = out["errors"]
        first = next(i for i, e in enumerate(errors) if e is not None)
        assert first <= 1 and all(e == errors[first] for e in errors[first:]), errors
        messages.add(errors[first])
    assert len(messages) == 1, messages
    return messages.pop()


def test_a_sticky_fault_raises_on_the_next_call_of_every_rank(tmp_path):
    res = gpu_ranks(2, tmp_path, ["sticky"], timeout=60)
    message = sticky_errors_agree(results(res))
    assert "cudaErrorIllegalAddress" in message and "collective #2" in message, message
    assert message.endswith("(the communicator is aborted; restart the job)")


def test_a_hang_with_work_in_flight_is_reported_with_the_collectives_number(tmp_path):
    res = gpu_ranks(2, tmp_path, ["hang_in_flight"], extra={"FLUIDCTL_TIMEOUT": "3"},
                    timeout=60)
    errors = set()
    for first, last in lines(res):
        assert last["queued_seconds"] < 1.0, res             # queued: no host wait
        errors.add(first["error"])
        assert first["seconds"] < 10
    assert len(errors) == 1, errors
    assert "NCCL allreduce (collective #2) did not finish within 3s" in errors.pop()


def test_a_full_queue_waits_for_its_oldest_work(tmp_path):
    res = gpu_ranks(2, tmp_path, ["backpressure"], extra={"FLUIDCTL_GPU_INFLIGHT": "2"})
    assert res.ok(), res
    out = results(res)[0]
    assert max(out["inflight"]) <= 1 and out["after_sync"] == 0 and out["ok"], out
    assert max(out["seconds"]) > 0.5, out            # rank 0 waited for the late rank 1
    assert results(res)[1]["ok"]


def test_coalesced_collectives_are_one_group_with_one_event(tmp_path):
    """The double launches a group's calls at groupEnd, as NCCL does: a division for 'mean'
    queued inside the group would run before the sum and give wrong values."""
    res = gpu_ranks(2, tmp_path, ["coalesced"])
    assert res.ok(), res
    for out in results(res):
        assert out["inside"] == 0 and out["ok"], out
        assert out["pushed"] == [[3, "group of 2 collectives ending with allreduce"]], out


def test_the_launchers_hang_watchdog_counts_completed_gpu_collectives(tmp_path):
    """Queued calls return at once, so they must not count as progress: with rank 1's stream
    stalled while both ranks go on calling (every 0.1 s for 20 s, FLUIDCTL_TIMEOUT far away),
    ``fluidctl train --hang-timeout 3`` finds the hang seconds in, not after the loop."""
    import os
    import subprocess
    import sys
    import rankspawn
    from test_runtime_gpu import DOUBLE
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: G (UUID: GPU-a)'\n"
                                       "echo 'GPU 1: G (UUID: GPU-b)'\n")
    (bindir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FLUIDCTL_TIMEOUT="60",
               FLUIDCTL_PYSPY="", PYTHONPATH=DOUBLE + os.pathsep + rankspawn.ROOT)
    env.update(FLUIDCTL_GPU_INFLIGHT="1000")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    import time
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "fluidctl", "train", "--gpus", "2",
                          "--hang-timeout", "3", "--log-dir", str(tmp_path / "log"),
                          "tests/gpu_worker.py", "hang_in_flight", "paced"],
                         cwd=rankspawn.ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    took = time.monotonic() - start
    assert res.returncode == 124, res.stdout + res.stderr
    assert took < 16, took                   # counting calls, not completions: >= 23 s
    assert "fluidctl: the job hung" in res.stderr
    assert "no collective completed for 3s" in res.stderr, res.stderr
