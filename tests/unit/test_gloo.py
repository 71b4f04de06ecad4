"""gloo's collective-mismatch abort and torch's DETAIL fingerprint errors, as recorded from real
torch 2.13 and Paddle 3.3.1 CPU jobs, read into mismatch/desync sentences."""
from fluidctl.diagnostics import gloo, triage
from fluidctl.diagnostics.failures import FailureKind
from fluidctl.diagnostics.watch import Triage

TORCH_ABORT = [
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
    "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:456] op.preamble.length <= op.nbytes. 1024 vs 512. Received data size doesn't "
    "match expected size. Is there a distributed collective mismatch in your code?"]
PADDLE_ABORT = [
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
    "  what():  [enforce fail at /paddle/third_party/gloo/gloo/transport/tcp/pair.cc:495] "
    "op.preamble.length <= op.nbytes. 1024 vs 512",
    "FatalError: `Process abort signal` is detected by the operating system."]
OPTIONS = ("TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided "
           "(default), requires_grad=false (default), pinned_memory=false (default), "
           "memory_format=(nullopt)))")


def detail(me, mine, other, theirs, op="ALLREDUCE", other_op="ALLREDUCE"):
    def print_(shape, dtype, optype):
        return (f"CollectiveFingerPrint(SequenceNumber=0, OpType={optype}, TensorShape=[{shape}]"
                f", TensorDtypes={dtype}, {OPTIONS}")
    return [f"[rank{me}]: Traceback (most recent call last):",
            f"[rank{me}]: RuntimeError: Detected mismatch between collectives on ranks. Rank "
            f"{me} is running collective: {print_(*mine, op)}, but Rank {other} is running "
            f"collective: {print_(*theirs, other_op)}.Collectives differ in the following "
            "aspects:   Tensor Tensor shapes: 512vs 1024"]


def test_torch_gloo_size_abort_is_a_mismatch_with_the_rank_and_bytes():
    v = gloo.classify_log(TORCH_ABORT, 0)
    assert v.kind == "mismatch" and v.ranks == [0]
    assert v.sentence.startswith("mismatch: rank 0 received a 1024-byte message from a peer "
                                 "where its collective expected 512 bytes, and gloo aborted it")
    assert v.sentence.endswith("TORCH_DISTRIBUTED_DEBUG=DETAIL makes torch name each rank's "
                               "shape and dtype")


def test_paddle_gloo_abort_is_the_same_mismatch_without_torch_hint():
    v = gloo.classify_log(PADDLE_ABORT, 1)
    assert v.kind == "mismatch" and "rank 1 received a 1024-byte message" in v.sentence
    assert "TORCH" not in v.sentence


def test_detail_fingerprints_of_three_ranks_name_the_odd_one_and_both_sizes():
    lines = (detail(0, ("512", "Float"), 1, ("1024", "Float"))
             + detail(2, ("512", "Float"), 1, ("1024", "Float")))
    v = gloo.classify_log(lines, 0)
    assert v.kind == "mismatch" and v.ranks == [1]
    assert v.sentence == ("mismatch: rank 1 called all_reduce with 1024 floats, ranks 0,2 with "
                          "512 floats (torch's collective check, TORCH_DISTRIBUTED_DEBUG=DETAIL)")


def test_detail_dtype_and_shape_and_different_ops():
    v = gloo.classify_log(detail(1, ("512", "Double"), 0, ("2, 256", "Float")))
    assert "rank 0 called all_reduce with [2, 256] floats, rank 1 with 512 doubles" in v.sentence
    v = gloo.classify_log(detail(1, ("512", "Float"), 0, ("512", "Float"),
                                 op="BROADCAST", other_op="_ALLGATHER_BASE"))
    assert v.kind == "desync"
    assert v.sentence.startswith("desync: rank 0 called all_gather_into_tensor with 512 floats, "
                                 "rank 1 called broadcast with 512 floats")


def test_other_logs_are_not_a_mismatch():
    assert gloo.classify_log(["Traceback (most recent call last):", "ValueError: x"]) is None
    assert gloo.classify_log(["op.preamble.length <= op.nbytes"]) is None


def test_triage_prefers_the_mismatch_to_the_abort_signal():
    found = triage.explain(-6, TORCH_ABORT, rank=2)
    assert found.kind is FailureKind.MISMATCH and "rank 2 received" in found.text
    found = triage.explain(1, detail(1, ("1024", "Float"), 0, ("512", "Float")), rank=1)
    assert found.kind is FailureKind.MISMATCH and "rank 0 called all_reduce" in found.text


def test_the_launcher_reads_the_other_ranks_fingerprints(tmp_path):
    from fluidctl.diagnostics.failures import Failure
    logs = [tmp_path / f"workerlog.{r}" for r in range(3)]
    logs[0].write_text("\n".join(detail(0, ("512", "Float"), 1, ("1024", "Float"))) + "\n")
    logs[1].write_text("\n".join(detail(1, ("1024", "Float"), 0, ("512", "Float"))) + "\n")
    logs[2].write_text("\n".join(detail(2, ("512", "Float"), 1, ("1024", "Float"))) + "\n")
    failure = Failure("trainer 2", "127.0.0.1", 1, str(logs[2]))
    Triage().explain(failure, [str(p) for p in logs])
    assert failure.kind is FailureKind.MISMATCH
    assert failure.explanation.startswith("mismatch: rank 1 called all_reduce with 1024 floats, "
                                          "ranks 0,2 with 512 floats")
