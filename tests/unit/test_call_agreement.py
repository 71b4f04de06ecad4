"""The metadata check's numpy fast path says what the per-row loop says, and the hash phase's
diagnosis names the first call at which the ranks' recent calls differ (agree.py)."""
import numpy as np
import pytest

from fluidctl.runtime.collective import meta
from fluidctl.runtime.collective.agree import RING, first_divergence


def table(n, **changes):
    t = np.empty((n, meta.RECORD), np.int64)
    t[:] = meta.record(5, "allreduce", "sum", np.float32, (4, 3))
    for rank, rec in changes.items():
        t[int(rank[1:])] = rec
    return t


@pytest.mark.parametrize("other", [
    meta.record(5, "allreduce", "sum", np.float32, (4, 4)),
    meta.record(5, "allreduce", "sum", np.float64, (4, 3)),
    meta.record(5, "allreduce", "max", np.float32, (4, 3)),
    meta.record(5, "broadcast", "sum", np.float32, (4, 3)),
    meta.record(6, "allreduce", "sum", np.float32, (4, 3)),
    meta.record(5, "allreduce", "sum", np.float32, (4, 3), problem=meta.NOT_CONTIGUOUS),
])
def test_a_mismatch_gets_the_per_row_message(other):
    t = table(1000, r777=other)
    assert meta.check(t) == meta._first_mismatch(t, True) is not None


def test_an_agreeing_table_is_checked_without_the_loop():
    assert meta.check(table(96000)) is None
    mean = meta.record(1, "allreduce", "mean", np.int32, (2,))
    assert "op 'mean' needs a floating dtype" in meta.check(np.tile(mean, (3, 1)))
    root = meta.record(1, "broadcast", "sum", np.float32, (2,), root=3)
    assert meta.check(np.tile(root, (3, 1))) == "broadcast: root 3 is not a rank (world size 3)"


def test_a_hash_comparison_beside_a_call_is_a_divergence():
    check = meta.record(9, "check of the collective calls", "max", np.int64, (4,))
    message = meta.check(table(4, r2=check))
    assert message.startswith(meta.DIVERGED)


def rings(calls_per_rank):
    """(world, RING, RECORD) from each rank's list of records, numbered from 1."""
    out = np.full((len(calls_per_rank), RING, meta.RECORD), -1, np.int64)
    for r, calls in enumerate(calls_per_rank):
        for i, rec in enumerate(calls[-RING:]):
            out[r, i] = rec
            out[r, i, meta.SEQ] = len(calls) - len(calls[-RING:]) + i + 1
    return out


def test_the_first_diverging_call_is_named_with_ranks_and_shapes():
    a = meta.record(0, "allreduce", "sum", np.float32, (4,))
    b = meta.record(0, "allreduce", "sum", np.float32, (6,))
    same = [a, b] * 40
    message = first_divergence(rings([same + [a, a, b], same + [b, a, a]]))
    assert message.startswith("the ranks' GPU collective calls diverged at collective #81: "
                              "allreduce: shape mismatch: rank 0 passed shape (4,), rank 1 "
                              "shape (6,)")


def test_a_rank_that_stopped_early_is_named():
    a = meta.record(0, "allreduce", "sum", np.float32, (4,))
    message = first_divergence(rings([[a] * 10, [a] * 7, [a] * 10]))
    assert message.startswith("the ranks' GPU collective calls diverged at collective #8: "
                              "rank(s) 1 had not reached it while rank 0 called allreduce")


def test_a_divergence_older_than_the_rings_says_how_to_find_it():
    a = meta.record(0, "allreduce", "sum", np.float32, (4,))
    message = first_divergence(rings([[a] * 200, [a] * 200]))
    assert "before collective #137" in message and "FLUIDCTL_STRICT_COLLECTIVES=1" in message
