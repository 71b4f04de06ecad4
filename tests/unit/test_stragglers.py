"""The straggler verdict (fluidctl/diagnostics/stragglerwatch.py) from known sums, the launcher's
watcher (confirmation, one line, rate limit, LOG_DIR files), and the rank's recorder on a real
diagnostics directory."""
import json

from fluidctl.diagnostics import stragglers as st

from fluidctl.diagnostics import stragglerwatch as sw
from fluidctl.paths import DiagDir, LogLayout

MS = 1_000_000


def sums(count, compute_ms, wait_ms, data_ms=0.0, link_ms=0.0, peer=-1):
    """A rank's sums after ``count`` collectives of these per-collective times."""
    return st.Sample(count, int(count * compute_ms * MS), int(count * wait_ms * MS),
                     int(count * data_ms * MS), int(count * link_ms * MS), peer)


def window(per_rank, before=10, n=10):
    """(before, now) readings: ``n`` collectives of per_rank[r] = (compute, wait, data, link)
    after ``before`` healthy ones."""
    ring = len(per_rank)
    first = {r: sums(before, 10, 1, 0, 0.1, (r - 1) % ring) for r in per_rank}
    now = {}
    for r, (c, w, d, l) in per_rank.items():
        a = first[r]
        now[r] = st.Sample(a.count + n, a.compute + int(n * c * MS), a.wait + int(n * w * MS),
                           a.data + int(n * d * MS), a.link + int(n * l * MS), a.peer)
    return first, now


def test_one_rank_computing_long_while_the_others_wait_is_slow_compute():
    v = sw.classify(*window({0: (10, 40, 0, 0), 1: (50, 1, 0, 0), 2: (10, 40, 0, 0)}))
    assert (v.kind, v.ranks, v.collectives, v.at) == ("compute", (1,), 10, 20)
    line = sw.describe(v, {0: "node1", 1: "node2", 2: "node3"})
    assert line.startswith("fluidctl: straggler: rank 1 (node2) is slow compute: 50.0 ms "
                           "per collective in compute against 10.0 ms on the others")


def test_a_whole_node_of_slow_ranks_is_named():
    v = sw.classify(*window({0: (10, 40, 0, 0), 1: (10, 40, 0, 0),
                             2: (50, 1, 0, 0), 3: (50, 1, 0, 0)}))
    assert (v.kind, v.ranks) == ("compute", (2, 3))
    assert "ranks 2, 3 (node2) are slow compute" in sw.describe(v, {2: "node2", 3: "node2"})


def test_the_slow_time_spent_in_the_data_loader_is_slow_data():
    v = sw.classify(*window({0: (10, 40, 0, 0), 1: (50, 1, 40, 0)}))
    assert (v.kind, v.ranks) == ("data", (1,))
    assert "in its data loader against 0.0 ms" in sw.describe(v, {})


def test_links_into_and_out_of_one_node_streaming_slowly_are_a_slow_link_there():
    v = sw.classify(*window({0: (10, 60, 0, 1), 1: (10, 60, 0, 50), 2: (10, 60, 0, 50)}))
    assert (v.kind, v.ranks, v.links) == ("link", (1, 2), ((0, 1), (1, 2)))
    line = sw.describe(v, {0: "node1", 1: "node2", 2: "node3"})
    assert "slow link at node2: ranks 0->1, 1->2 stream 50.0 ms" in line


def test_even_ranks_too_few_collectives_or_nobody_waiting_are_no_verdict():
    assert sw.classify(*window({0: (10, 1, 0, 0.1), 1: (12, 1, 0, 0.1), 2: (11, 1, 0, 0.1)})) \
        is None
    assert sw.classify(*window({0: (10, 40, 0, 0), 1: (50, 1, 0, 0)}, n=2)) is None
    # one rank computes longer but nobody waited for it (independent work): not a straggler
    assert sw.classify(*window({0: (10, 1, 0, 0), 1: (50, 1, 0, 0), 2: (10, 1, 0, 0)})) \
        is None


def test_watcher_says_a_confirmed_verdict_once_and_writes_it_to_log_dir(tmp_path):
    said, t = [], [0.0]
    readings = []

    def samples():
        return readings[-1]

    watcher = sw.Watcher(samples, lambda: {1: "node2"}, said.append, tmp_path,
                         clock=lambda: t[0])
    total = {0: [0, 0, 0], 1: [0, 0, 0]}
    for tick in range(12):
        slow = tick >= 4
        for r, (c, w) in {0: (10, 40 if slow else 1), 1: (50 if slow else 10, 1)}.items():
            total[r][0] += 5
            total[r][1] += 5 * c * MS
            total[r][2] += 5 * w * MS
        readings.append({r: st.Sample(n, c, w, 0, 0, -1) for r, (n, c, w) in total.items()})
        t[0] += 0.5
        watcher.step()
    assert len(said) == 1 and "rank 1 (node2) is slow compute" in said[0]
    layout = LogLayout(tmp_path)
    assert layout.stragglers_log.read_text().count("straggler:") == 1
    record = json.loads(layout.stragglers_json.read_text())
    assert (record["kind"], record["ranks"], record["hosts"]) == ("compute", [1], {"1": "node2"})
    t[0] += sw.REPEAT
    readings.append({r: st.Sample(n + 5, c + 250 * MS * (r == 1) + 50 * MS * (r == 0),
                                  w + 200 * MS * (r == 0) + 5 * MS, 0, 0, -1)
                     for r, (n, c, w) in total.items()})
    watcher.step()
    assert len(said) == 2            # the same verdict again after REPEAT seconds


def test_recorder_sums_collectives_data_and_link_in_shared_memory(tmp_path):
    diag = DiagDir(tmp_path)
    rec = st.Recorder(diag, 3)
    try:
        rec.last -= 5 * MS                   # 5 ms of compute before the call
        rec.collective(st.clock() - 2 * MS)  # ... called 2 ms ago
        st._recorder = rec
        st.set_peer(2)
        assert list(st.timed_batches(iter([1, 2]))) == [1, 2]
        st.add(st.LINK, 7)
        (got,) = st.read_all(diag).values()
        assert got.count == 1 and got.peer == 2 and got.link == 7 and got.data > 0
        assert 2 * MS <= got.wait < 100 * MS and 2 * MS <= got.compute < 100 * MS
        assert st.from_wire(st.to_wire({3: got})) == {3: got}
    finally:
        st._recorder = None
        rec.close()
