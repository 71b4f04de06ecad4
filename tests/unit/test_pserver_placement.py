"""Block tables against worked examples (Paddle's slice_variable + dispatchers)."""
import zlib

import numpy as np
import pytest

from fluidctl.runtime.pserver import placement
from fluidctl.runtime.pserver.placement import block_table, slice_tensor


def rows(blocks):
    return [(b.key, b.offset, b.numel, b.shape) for b in blocks]


@pytest.mark.parametrize("shape, pservers, expected", [
    # 10000 elements: 10000 // 8192 = 1 block at most, whatever the pserver count
    ((10000,), 2, [("w", 0, 10000, (10000,))]),
    # 20000 // 8192 = 2 < 3 pservers: two blocks of 10000
    ((20000,), 3, [("w.block0", 0, 10000, (10000,)), ("w.block1", 10000, 10000, (10000,))]),
    # 1000x100 on 3: ceil(100000/3) = 33334, rounded up to whole rows of 100 -> 33400
    ((1000, 100), 3, [("w.block0", 0, 33400, (334, 100)), ("w.block1", 33400, 33400, (334, 100)),
                      ("w.block2", 66800, 33200, (332, 100))]),
    # 5x10000 on 4: 12500 rounds up to 2 rows = 20000, so only 3 blocks remain
    ((5, 10000), 4, [("w.block0", 0, 20000, (2, 10000)), ("w.block1", 20000, 20000, (2, 10000)),
                     ("w.block2", 40000, 10000, (1, 10000))]),
    # 3-D: rows are the trailing 4x8 = 32 elements; 40000/2 = 20000 = 625 rows exactly
    ((1250, 4, 8), 2, [("w.block0", 0, 20000, (625, 4, 8)), ("w.block1", 20000, 20000, (625, 4, 8))]),
    # uneven 1-D tail: 32769 on 8 pservers -> 4 blocks of 8193, last 8190
    ((32769,), 8, [("w.block0", 0, 8193, (8193,)), ("w.block1", 8193, 8193, (8193,)),
                   ("w.block2", 16386, 8193, (8193,)), ("w.block3", 24579, 8190, (8190,))]),
    # small and scalar tensors stay whole
    ((3,), 2, [("w", 0, 3, (3,))]),
    ((), 2, [("w", 0, 1, ())]),
])
def test_slice_worked_examples(shape, pservers, expected):
    blocks = slice_tensor("w", shape, pservers)
    assert rows(blocks) == expected
    assert sum(b.numel for b in blocks) == int(np.prod(shape))


def test_min_block_size_is_a_parameter():
    assert [b.numel for b in slice_tensor("w", (100,), 4, min_block_size=30)] == [34, 34, 32]


def test_round_robin_deals_blocks_across_tensors_in_order():
    table = block_table({"w": (20000,), "b": (10,), "e": (1000, 100)}, ["a:1", "b:2", "c:3"])
    assert [(b.key, s) for b, s in table] == [
        ("w.block0", 0), ("w.block1", 1), ("b", 2), ("e.block0", 0), ("e.block1", 1),
        ("e.block2", 2)]


def test_slice_var_up_off_keeps_tensors_whole():
    table = block_table({"w": (20000,), "b": (10,), "e": (1000, 100)}, ["a:1", "b:2"],
                        slice_var_up=False)
    assert [(b.key, b.numel, s) for b, s in table] == [("w", 20000, 0), ("b", 10, 1),
                                                       ("e", 100000, 0)]


def test_hash_name_is_crc32_and_stable():
    table = block_table({"fc_0.w_0": (4, 4), "fc_0.b_0": (4,), "emb": (30000,)},
                        ["h:1", "h:2", "h:3"], split_method="HashName")
    for block, server in table:
        assert server == zlib.crc32(block.key.encode()) % 3
    # pinned values: a different hash (e.g. Python's hash()) would move parameters
    assert [s for _, s in table] == [zlib.crc32(k.encode()) % 3 for k in
                                     ("fc_0.w_0", "fc_0.b_0", "emb.block0", "emb.block1",
                                      "emb.block2")]
    assert zlib.crc32(b"fc_0.w_0") == 2678650214 and placement.hash_name("fc_0.w_0", 3) == 2


def test_callable_split_method_gets_names_and_endpoints():
    seen = {}

    def everything_on_last(names, endpoints):
        seen["names"], seen["endpoints"] = names, endpoints
        return [endpoints[-1]] * len(names)
    table = block_table({"w": (20000,), "b": (3,)}, ["a:1", "b:2"],
                        split_method=everything_on_last)
    assert seen == {"names": ["w.block0", "w.block1", "b"], "endpoints": ["a:1", "b:2"]}
    assert [s for _, s in table] == [1, 1, 1]


@pytest.mark.parametrize("method, match", [
    ("Random", "unknown split_method"),
    (lambda names, eps: ["nowhere:1"] * len(names), "not a pserver"),
    (lambda names, eps: [], "returned 0 endpoints"),
])
def test_bad_split_methods(method, match):
    with pytest.raises(ValueError, match=match):
        block_table({"w": (3,)}, ["a:1"], split_method=method)


def test_fingerprint_changes_with_placement():
    a = block_table({"w": (20000,), "b": (3,)}, ["a:1", "b:2"])
    b = block_table({"b": (3,), "w": (20000,)}, ["a:1", "b:2"])
    assert placement.fingerprint(a) == placement.fingerprint(
        block_table({"w": (20000,), "b": (3,)}, ["x:1", "y:2"]))
    assert placement.fingerprint(a) != placement.fingerprint(b)


def test_sparse_rows_go_to_id_mod_pservers_including_negative_ids():
    ids = np.array([0, 1, 2, 3, 7, -1, 1 << 62], dtype=np.int64)
    owners = placement.sparse_owner(ids, 3)
    assert owners[:5].tolist() == [0, 1, 2, 0, 1]
    assert owners[5] == (2 ** 64 - 1) % 3 and owners[6] == (1 << 62) % 3
