"""Canonical shards (shard-data --shards N) read in an epoch's global order: a job stopped at one
world size and resumed at another consumes every sample of the epoch exactly once. Property
tests over the order alone and over real shards; real trainer processes under fluidctl train:
tests/e2e/test_canonical_resume.py."""
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidctl.errors import UsageError
from fluidctl.runtime import order
from fluidctl.runtime.data import ShardReader, shard_path
from shardutil import run, write_lines

WORLDS = (4, 3, 4)


def test_permutation_is_a_bijection_table_or_feistel():
    for n in [*range(0, 40), order.SMALL, order.SMALL + 1, 3000, 4097]:
        for key in (0, 12345):
            perm = order.Permutation(n, key)
            assert sorted(perm(i) for i in range(n)) == list(range(n)), n
    assert [order.Permutation(10, 1)(i) for i in range(10)] != list(range(10))
    big = [order.Permutation(3000, 9)(i) for i in range(3000)]
    assert sum(a == b for a, b in enumerate(big)) < 10


def test_small_orders_are_uniform():
    """24 orders of 4 items over 2400 keys: each about 100 times (a Feistel network's are not)."""
    seen = Counter(tuple(order.Permutation(4, order.key_of(k))(i) for i in range(4))
                   for k in range(2400))
    assert len(seen) == 24 and 55 < min(seen.values()) and max(seen.values()) < 145, seen


def test_the_order_is_fixed_by_seed_and_epoch():
    counts = [5, 9, 1, 7]
    one = [order.EpochOrder(counts, 3, 0).sample(p) for p in range(22)]
    assert one == [order.EpochOrder(counts, 3, 0).sample(p) for p in range(22)]
    assert one != [order.EpochOrder(counts, 3, 1).sample(p) for p in range(22)]
    assert one != [order.EpochOrder(counts, 4, 0).sample(p) for p in range(22)]
    assert [order.EpochOrder(counts, 3, 0, shuffle=False).sample(p) for p in range(22)] == \
        [(s, r) for s, c in enumerate(counts) for r in range(c)]


def simulate(counts, seed, batch_sizes, stops, drop_last=False):
    """Run ranks of 4, then 3, then 4 ... (one segment per stop: that many steps, or to the
    epoch's end) over the pure order; per epoch, the (shard, record) pairs every rank took."""
    total = sum(counts)
    epoch, offset, consumed = 0, 0, {}
    for k, stop in enumerate(stops):
        world, batch = WORLDS[k % len(WORLDS)], batch_sizes[k % len(batch_sizes)]
        per_step = batch * world
        steps = min(stop, order.steps_left(offset, total, per_step, drop_last))
        epoch_order = order.EpochOrder(counts, seed, epoch)
        for rank in range(world):
            ranges = list(order.rank_steps(offset, rank, world, batch, total, drop_last))[:steps]
            taken = [epoch_order.sample(p) for r in ranges for p in r]
            assert taken == [(s, i) for r in ranges for s, rs in epoch_order.runs(r) for i in rs]
            consumed.setdefault(epoch, []).extend(taken)
        offset = order.offset_after(offset, steps, per_step, total)
        if order.steps_left(offset, total, per_step, drop_last) == 0:
            epoch, offset = epoch + 1, 0
    return consumed


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=1, max_size=8),
       seed=st.integers(0, 2**32), batch_sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       stops=st.lists(st.integers(0, 12), min_size=1, max_size=9))
def test_any_stops_at_4_3_4_ranks_consume_each_sample_once_per_epoch(counts, seed, batch_sizes,
                                                                    stops):
    everything = Counter((s, r) for s, c in enumerate(counts) for r in range(c))
    consumed = simulate(counts, seed, batch_sizes, stops + [10**6] * 3)
    finished = [e for e in consumed if e < max(consumed)]
    assert finished, consumed
    for epoch in finished:
        assert Counter(consumed[epoch]) == everything, epoch
    last = Counter(consumed[max(consumed)])           # a partial epoch: no sample twice
    assert all(v == 1 for v in last.values()) and not last - everything


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=1, max_size=6), seed=st.integers(0, 99),
       batch=st.integers(1, 5), stops=st.lists(st.integers(0, 8), min_size=1, max_size=6))
def test_drop_last_never_repeats_and_steps_agree(counts, seed, batch, stops):
    consumed = simulate(counts, seed, [batch], stops + [10**6] * 3, drop_last=True)
    for samples in consumed.values():
        assert len(samples) == len(set(samples))


def _canonical(tmp_path, records, shards, fmt="text"):
    src = write_lines(tmp_path / "data.txt", [b"%d" % i for i in range(records)])
    out = tmp_path / "canon"
    run([src], shards, out, canonical=True, format=fmt)
    return out


def read_segments(directory, seed, batch_sizes, stops, worlds=WORLDS):
    """Real readers, one per rank of 4, 3, 4 ... ranks; the state goes from one segment to the
    next through JSON, as a checkpoint would carry it. Per epoch: the records every rank read."""
    state, consumed = None, {}
    for k, stop in enumerate(stops):
        world, batch = worlds[k % len(worlds)], batch_sizes[k % len(batch_sizes)]
        states = []
        for rank in range(world):
            reader = ShardReader(str(directory), batch, seed=seed, state=state, rank=rank,
                                 world=world)
            epoch, steps = reader.epoch, len(reader)
            taken = 0
            for batch_records in reader:
                consumed.setdefault(epoch, []).extend(batch_records)
                taken += 1
                if taken == min(stop, steps):
                    break
            states.append(reader.state())
        assert all(s == states[0] for s in states), states     # every rank saves the same
        state = json.loads(json.dumps(states[0]))
    return consumed


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.integers(1, 120), shards=st.integers(1, 7), seed=st.integers(0, 10**6),
       batch_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       stops=st.lists(st.integers(1, 10), min_size=2, max_size=6))
def test_real_shards_resumed_4_3_4_read_every_record_once_per_epoch(tmp_path_factory, records,
                                                                   shards, seed, batch_sizes,
                                                                   stops):
    shards = min(shards, records)
    directory = _canonical(tmp_path_factory.mktemp("d"), records, shards)
    everything = Counter(str(i) for i in range(records))
    consumed = read_segments(directory, seed, batch_sizes, stops + [10**6] * 3)
    single = read_segments(directory, seed, [1], [10**6], worlds=(1,))
    assert Counter(single[0]) == everything
    for epoch in (e for e in consumed if e < max(consumed)):
        assert Counter(consumed[epoch]) == everything


def test_tail_short_and_empty_batches_keep_every_rank_in_step(tmp_path):
    directory = _canonical(tmp_path, 10, 3)
    batches = [list(ShardReader(str(directory), 2, rank=r, world=4)) for r in range(4)]
    assert [len(b) for b in batches] == [2, 2, 2, 2]                # 10 = 8 + 2: one more step
    assert [len(b[-1]) for b in batches] == [1, 1, 0, 0]
    dropped = [list(ShardReader(str(directory), 2, rank=r, world=4, drop_last=True))
               for r in range(4)]
    assert [len(b) for b in dropped] == [1, 1, 1, 1]


def test_state_resumes_and_next_epoch_differs(tmp_path):
    directory = _canonical(tmp_path, 30, 4)
    reader = ShardReader(str(directory), 4, seed=5, rank=0, world=1)
    first = next(iter(reader))
    assert reader.state() == {"epoch": 0, "offset": 4, "seed": 5, "shuffle": True,
                              "samples": 30, "shards": 4}
    epoch0 = first + [r for b in reader for r in b]
    assert reader.state()["epoch"] == 1 and reader.epoch == 1
    epoch1 = [r for b in reader for r in b]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    plain = ShardReader(str(directory), 30, shuffle=False, rank=0, world=1)
    assert next(iter(plain)) == [str(i) for i in range(30)]


def test_csv_and_jsonl_records(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("a,b\n" + "".join(f'{i},"x,{i}"\n' for i in range(9)))
    run([csv], 2, tmp_path / "c", canonical=True, format="csv")
    rows = [r for b in ShardReader(str(tmp_path / "c"), 4, rank=0, world=1) for r in b]
    assert sorted(rows) == sorted([str(i), f"x,{i}"] for i in range(9))
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(7)))
    run([jsonl], 3, tmp_path / "j", canonical=True, format="jsonl")
    objs = [o for b in ShardReader(str(tmp_path / "j"), 2, rank=0, world=1) for o in b]
    assert sorted(o["id"] for o in objs) == list(range(7))


def test_bad_states_and_layouts_are_one_line_errors(tmp_path):
    directory = _canonical(tmp_path, 20, 2)
    good = ShardReader(str(directory), 2, seed=1, rank=0, world=2).state()
    for change, words in (({"seed": 2}, "seed=1"), ({"samples": 21}, "samples=20"),
                          ({"offset": 21}, "out of range"), ({"epoch": -1}, "out of range")):
        with pytest.raises(UsageError, match=words):
            ShardReader(str(directory), 2, seed=1, rank=0, world=2, state={**good, **change})
    with pytest.raises(UsageError, match="lacks epoch"):
        ShardReader(str(directory), 2, seed=1, rank=0, world=2, state={"epoch": 0})
    with pytest.raises(UsageError, match="canonical shards"):
        shard_path(str(directory), rank=0, world=2)
    per_trainer = tmp_path / "per"
    run([tmp_path / "data.txt"], 2, per_trainer)
    with pytest.raises(UsageError, match="need canonical shards"):
        ShardReader(str(per_trainer), 2, state=good, rank=0, world=2)
    with pytest.raises(UsageError, match="per-trainer shard"):
        ShardReader(str(per_trainer), 2, rank=0, world=2).state()


def test_a_truncated_shard_is_named_not_read_short(tmp_path):
    directory = _canonical(tmp_path, 20, 2)
    victim = sorted(directory.glob("data.txt-*"))[1]
    victim.write_bytes(victim.read_bytes()[:-5])
    with pytest.raises(UsageError, match=f"shard {victim} holds .* record"):
        list(ShardReader(str(directory), 20, shuffle=False, rank=0, world=1))
    with pytest.raises(UsageError, match="does not match|has .* bytes"):
        ShardReader(str(directory), 2, rank=0, world=1, verify=True)
