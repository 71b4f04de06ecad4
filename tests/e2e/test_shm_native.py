"""The same-node native path (_fastshm.c) between real ranks: exact against numpy over dtypes,
shapes and ops, interchangeable with the Python path rank by rank, mismatches still named after
many agreeing calls, a late peer waited for across wait slices, and the build's fallback."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import rankspawn
from fluidctl import envs
from fluidctl.runtime.collective import shmwait

WORKER = "tests/shm_worker.py"
HOSTS = ["127.0.0.1", "127.0.0.1"]
BUILT = shmwait.native() is not None
needs_native = pytest.mark.skipif(not BUILT, reason="the native module is not built here "
                                  "(pip install -e . with a C compiler builds it)")

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
DTYPES = ["float32", "float64", "float16", "bool"] + INTS


@st.composite
def case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    ops = ["sum", "max", "min"] + (["mean"] if dtype.startswith("float") else [])
    # up to a few thousand elements, and sizes around the native path's one-piece limit
    size = draw(st.one_of(st.integers(0, 4100), st.sampled_from([65535, 131072, 262145])))
    shape = draw(st.sampled_from([[size], [1, size], [size, 1]]))
    return [dtype, shape, draw(st.sampled_from(ops)), draw(st.integers(0, 2**31))]


def run(scenario, tmp_path, *args, extra=None, per_rank=None, timeout=120):
    envs = rankspawn.rank_envs(2, HOSTS, extra=extra)
    for rank, more in (per_rank or {}).items():
        envs[rank].update(more)
    result = rankspawn.Ranks([WORKER, scenario, *args], envs, str(tmp_path)).wait(timeout)
    assert result.ok(), result
    return rankspawn.results(result)


@pytest.mark.parametrize("mix", ["native", "native+python"])
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(todo=st.lists(case(), min_size=20, max_size=40))
def test_allreduce_is_exact_on_both_paths(mix, todo, tmp_path_factory):
    """Every rank's result equals numpy's reduction; with one rank on the Python path the two
    paths interoperate call by call (same slots, counters and metadata)."""
    tmp = tmp_path_factory.mktemp("cases")
    path = tmp / "cases.json"
    path.write_text(json.dumps(todo))
    per_rank = {1: {"FLUIDCTL_SHM_NATIVE": "0"}} if mix == "native+python" else None
    results = run("cases", tmp, str(path), per_rank=per_rank)
    for rank, res in enumerate(results):
        assert res["wrong"] == [], (rank, res["wrong"])
        assert res["calls"] == len(todo)
    assert results[0]["native"] is BUILT
    if per_rank:
        assert results[1]["native"] is False


@pytest.mark.parametrize("native", ["1", "0"])
def test_mismatch_is_named_after_many_calls(native, tmp_path):
    results = run("after_many", tmp_path, extra={"FLUIDCTL_SHM_NATIVE": native})
    assert results[0] == results[1], results
    got = results[0]
    assert "shape mismatch: rank 0 passed shape (1024,), rank 1 shape (1025,)" in got["shape"]
    assert ("dtype mismatch: rank 0 passed float32, rank 1 passed float16"
            in got["dtype_native_vs_python"])
    assert "rank 1 passed a read-only array" in got["read_only"]
    assert "rank 0 asked for op 'min' but rank 1 for 'max'" in got["op"]
    assert got["still_works"] is True


def test_a_late_peer_is_waited_for_across_slices(tmp_path):
    results = run("late", tmp_path)
    assert all(r["ok"] for r in results), results
    assert results[0]["waited"] > 0.5        # it did wait (more than two liveness slices)


@pytest.mark.parametrize("native", ["1", "0"])
def test_native_switch(native, tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_SHM_NATIVE", native)
    assert (shmwait.native() is not None) is (BUILT and native == "1")


@pytest.mark.parametrize("how", ["no-compiler", "pure-wheel"])
def test_a_build_without_the_module_succeeds(how, tmp_path):
    """setup.py's extension is optional: with a compiler that fails, the build still succeeds
    (and the runtime then runs its Python path); FLUIDCTL_PURE_WHEEL=1 leaves it out."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = (dict(os.environ, CC="false", LDSHARED="false") if how == "no-compiler"
           else dict(os.environ, **{envs.PURE_WHEEL: "1"}))
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                           str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if how == "no-compiler":
        assert "_fastshm" in proc.stderr and "failed" in proc.stderr.lower()
    assert not list((tmp_path / "lib").rglob("_fastshm*.so"))
