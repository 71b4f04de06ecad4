"""Collectives between real processes: shared memory (one node), the TCP ring (ranks on
127.0.0.1 and 127.0.0.2 count as two nodes) and hierarchical (two ranks on one "node", one on
the other). Every failure must be a clear error on every rank, never a hang."""
import pytest

import rankspawn

WORKER = "tests/runtime_worker.py"
TOPOLOGIES = {
    "shm": ["127.0.0.1", "127.0.0.1"],
    "ring": ["127.0.0.1", "127.0.0.2"],
    "hierarchical": ["127.0.0.1", "127.0.0.1", "127.0.0.2"],
}


@pytest.fixture(autouse=True)
def no_shm_leaks():
    before = rankspawn.shm_segments()
    yield
    assert rankspawn.shm_segments() - before == set()


def run(scenario, hosts, tmp_path, timeout=60, **kw):
    result = rankspawn.run([WORKER, scenario], len(hosts), tmp_path, timeout=timeout,
                           hosts=hosts, **kw)
    assert "resource_tracker" not in "".join(result.outputs)   # no leaked-segment warnings
    return result


LARGER = {
    "ring": ["127.0.0.1", "127.0.0.2", "127.0.0.3"],
    "hierarchical": ["127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"],
}


@pytest.mark.parametrize("topology,hosts", list(TOPOLOGIES.items()) + list(LARGER.items()),
                         ids=list(TOPOLOGIES) + [f"{k}-{len(v)}" for k, v in LARGER.items()])
def test_ops_are_exact(topology, hosts, tmp_path):
    result = run("ops", hosts, tmp_path)
    assert result.ok(), result
    for rank_result in rankspawn.results(result):
        assert rank_result.pop("transport") == topology
        rank_result.pop("shm_direct")
        native = rank_result.pop("shm_native")
        if topology == "shm" and native is not None:
            assert native is True       # the native slots take every size by default
        failed = [name for name, ok in rank_result.items() if ok is not True]
        assert not failed, (failed, result)


@pytest.mark.parametrize("ranks,direct", [(2, "0"), (3, "1"), (3, "0")],
                         ids=["2-pipelined", "3-direct", "3-pipelined"])
def test_shared_memory_paths_are_exact(ranks, direct, tmp_path):
    """Every op through the pipelined slots (FLUIDCTL_SHM_DIRECT=0 forces them for all sizes)
    and through direct peer reads (FLUIDCTL_SHM_DIRECT=1 from 4 MiB), with 3 ranks on one node
    too."""
    result = run("ops", ["127.0.0.1"] * ranks, tmp_path, extra={"FLUIDCTL_SHM_DIRECT": direct})
    assert result.ok(), result
    for rank_result in rankspawn.results(result):
        assert rank_result.pop("transport") == "shm"
        used_direct = rank_result.pop("shm_direct")
        rank_result.pop("shm_native")
        if direct == "0":
            assert used_direct is False
        elif not used_direct:
            pytest.skip("this kernel does not let ranks read each other's memory (ptrace_scope)")
        failed = [name for name, ok in rank_result.items() if ok is not True]
        assert not failed, (failed, result)


def test_sizes_across_the_direct_switch_mismatch_cleanly(tmp_path):
    result = run("switch_mismatch", TOPOLOGIES["shm"], tmp_path,
                 extra={"FLUIDCTL_SHM_DIRECT": "1"})
    assert result.ok(), result
    per_rank = rankspawn.results(result)
    assert per_rank[0] == per_rank[1] and per_rank[0]["still_works"] is True
    assert "shape mismatch: rank 0 passed shape (1310720,), rank 1 shape (786432,)" \
        in per_rank[0]["error"]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_bad_input_is_the_same_error_everywhere(topology, tmp_path):
    result = run("errors", TOPOLOGIES[topology], tmp_path)
    assert result.ok(), result
    per_rank = rankspawn.results(result)
    assert all(r == per_rank[0] for r in per_rank), per_rank
    errors = per_rank[0]
    assert errors.pop("still_works") is True
    expected = {
        "shape": "shape mismatch: rank 0 passed shape (3,), rank 1 shape (4,)",
        "dtype": "dtype mismatch: rank 0 passed float32, rank 1 passed float64",
        "unsupported": "rank 0 passed complex64, which collectives do not support",
        "op": "rank 0 asked for op 'sum' but rank 1 for 'max'",
        "mean_int": "op 'mean' needs a floating dtype, got int32",
        "not_array": "rank 1 passed something that is not a numpy/cupy array",
        "kind": "rank 0 called broadcast but rank 1 called allreduce",
        "root": "is not a rank",
        "bad_op": "unknown op",
    }
    for name, text in expected.items():
        assert text in errors[name], (name, errors[name])


@pytest.mark.parametrize("topology,hosts", [("ring", LARGER["ring"]),
                                             ("hierarchical", LARGER["hierarchical"])])
def test_between_nodes_a_signature_is_agreed_in_full_once(topology, hosts, tmp_path):
    """Later calls are checked by the ring's fixed headers, not by the whole world's records:
    an allreduce, a broadcast from each rank and an allgather, 20 times each, and the barrier
    (always in full), make 3 + world size full rounds (61 if every call went round in full)."""
    result = run("agreed_once", hosts, tmp_path)
    assert result.ok(), result
    per_rank = rankspawn.results(result)
    assert all(r["ok"] for r in per_rank), per_rank
    assert {r["full"] for r in per_rank if r["full"] is not None} == {3 + len(hosts)}, per_rank


LATE = {   # variant, odd rank, hosts -> words every rank's error holds
    "ring-new": ("new", 1, TOPOLOGIES["ring"],
                 ["shape mismatch", "shape (4,)", "shape (5,)", "communicator is closed"]),
    "ring-agreed": ("agreed", 2, LARGER["ring"],
                    ["shape mismatch", "shape (4,)", "shape (8,)", "rank 2"]),
    "ring-kind": ("kind", 0, LARGER["ring"], ["called broadcast", "called allreduce"]),
    "hierarchical-leader": ("new", 2, TOPOLOGIES["hierarchical"],
                            ["shape mismatch", "shape (5,)", "rank 2"]),
    "hierarchical-same-node": ("agreed", 1, TOPOLOGIES["hierarchical"],
                               ["shape mismatch: rank 0 passed shape (4,), rank 1 shape (8,)"]),
}


@pytest.mark.parametrize("case", LATE)
def test_a_rank_diverging_after_first_use_fails_every_rank_alike(case, tmp_path):
    variant, odd, hosts, words = LATE[case]
    result = run("late_mismatch", hosts, tmp_path,
                 extra={"TEST_VARIANT": variant, "TEST_ODD_RANK": str(odd)})
    assert result.ok(), result
    per_rank = rankspawn.results(result)
    errors = {r["error"] for r in per_rank}
    assert len(errors) == 1, per_rank
    error = errors.pop()
    for word in words:
        assert word in error, (word, error)
    assert all("broken" in r["after"] for r in per_rank), per_rank


def test_strict_collectives_agree_every_call_in_full(tmp_path):
    """FLUIDCTL_STRICT_COLLECTIVES=1: the same late mismatch is found in full, named the same
    on every rank, and the ring stays usable."""
    result = run("late_mismatch", TOPOLOGIES["ring"], tmp_path,
                 extra={"TEST_VARIANT": "new", "TEST_ODD_RANK": "1",
                        "FLUIDCTL_STRICT_COLLECTIVES": "1"})
    assert result.ok(), result
    per_rank = rankspawn.results(result)
    assert per_rank[0] == per_rank[1], per_rank
    assert "shape mismatch: rank 0 passed shape (4,), rank 1 shape (5,)" in per_rank[0]["error"]
    assert "closed" not in per_rank[0]["error"] and per_rank[0]["after"] == "works"


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_a_killed_rank_is_reported_and_leaks_nothing(topology, tmp_path):
    hosts = TOPOLOGIES[topology]
    result = run("die", hosts, tmp_path, extra={"TEST_TIMEOUT": "5"})
    dead = len(hosts) - 1
    assert result.returncodes[dead] == -9
    for rank, rank_result in enumerate(rankspawn.results(result)[:dead]):
        assert result.returncodes[rank] == 0, result
        error = rank_result["error"]
        assert f"rank {dead}" in error or "lost the connection" in error, error
        if topology == "shm":
            assert f"rank {dead} (pid" in error and "died" in error


@pytest.mark.parametrize("topology", ["shm", "ring"])
def test_a_rank_that_never_comes_times_out_by_name(topology, tmp_path):
    result = run("stuck", TOPOLOGIES[topology], tmp_path, until=[0],
                 extra={"TEST_TIMEOUT": "2"})
    error = rankspawn.results(result)[0]["error"]
    assert "rank 1" in error and ("within 2s" in error or "timed out" in error), error


def test_missing_rank_at_start_is_named_with_its_endpoint(tmp_path):
    envs = rankspawn.rank_envs(3, extra={"TEST_TIMEOUT": "2"})
    endpoint = envs[2]["PADDLE_CURRENT_ENDPOINT"]
    result = rankspawn.Ranks([WORKER, "ops"], envs[:2], str(tmp_path)).wait(60)
    assert result.returncodes == [1, 1]
    for out in result.outputs:
        assert f"rank 2 ({endpoint}) did not join within 2s" in out, out


def test_wrong_token_is_refused(tmp_path):
    envs = rankspawn.rank_envs(2, extra={"TEST_TIMEOUT": "3"})
    envs[1]["FLUIDCTL_JOB_TOKEN"] = "not-the-job-token"
    result = rankspawn.Ranks([WORKER, "ops"], envs, str(tmp_path)).wait(60)
    assert result.returncodes == [1, 1]
    assert "rejected this process" in result.outputs[1]
    assert "rank 1" in result.outputs[0] and "did not join" in result.outputs[0]
