"""Contract tests against the REAL cupy-cuda12x and nvidia-nccl-cu12 (installed by the test
extra; this machine has no GPU): the double in tests/cupy_double offers nothing real CuPy lacks
and matches what fluidctl uses (names, NCCL_* values, signatures, id form, error texts, Flags),
and fluidctl's real GPU handshake ends every rank within seconds with one clear error where no
GPU can be used. The real cupy is only ever imported in subprocesses (the double shares its
name)."""
import json
import pathlib
import os
import re
import subprocess
import sys

import pytest

import rankspawn

ROOT = rankspawn.ROOT
DOUBLE = os.path.join(ROOT, "tests", "cupy_double")
USED = {  # what fluidctl/runtime/collective/nccl.py calls on a communicator
    "allReduce", "reduce", "broadcast", "allGather", "reduceScatter", "check_async_error",
    "abort", "destroy", "rank_id", "size", "device_id"}


def _python(code_or_file, path=None, env=None, timeout=120):
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, ROOT) if p)
    argv = [sys.executable, code_or_file] if code_or_file.endswith(".py") else \
        [sys.executable, "-c", code_or_file]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _has_real_cupy():
    return _python("import cupy").returncode == 0


def _real_gpu():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout


pytestmark = pytest.mark.skipif(not _has_real_cupy(), reason="the real cupy is not installed "
                                "(pip install -e '.[test]' installs cupy-cuda12x)")


@pytest.fixture(scope="module")
def surfaces():
    real = _python("tests/cupy_surface.py")
    assert real.returncode == 0, real.stderr
    double = _python("tests/cupy_surface.py", path=DOUBLE)
    assert double.returncode == 0, double.stderr
    old = _python("tests/cupy_surface.py", path=DOUBLE, env={"CUPY_DOUBLE_VERSION": "13.6.0"})
    assert old.returncode == 0, old.stderr
    return json.loads(real.stdout), json.loads(double.stdout), json.loads(old.stdout)


def test_real_cupy_is_14_with_nccl(surfaces):
    real, _, _ = surfaces
    assert real["major"] >= 14 and real["available"] is True
    assert real["uid"] == ["bytes", 128] and real["version_type"] == "int"


def test_nccl_constants_and_functions_match(surfaces):
    real, double, _ = surfaces
    assert double["constants"] == real["constants"]
    assert double["functions"] == real["functions"]
    assert double["error_text"] == real["error_text"] and double["error_status"] == 6
    assert real["error_is_runtime_error"] and double["error_is_runtime_error"]


def test_communicator_signatures_match(surfaces):
    real, double, _ = surfaces
    assert USED <= set(real["comm_methods"]) and USED <= set(double["comm_methods"])
    for name, params in double["comm_methods"].items():
        assert real["comm_methods"].get(name) == params, name
    assert double["ctor"] == real["ctor"] == ["ndev", "commId", "rank", "config"]
    assert double["uid"] == real["uid"]


def test_cupy13_mode_follows_the_v13_source(surfaces):
    """v13.6.0 nccl.pyx: ``def __init__(self, int ndev, tuple commId, int rank)`` and
    ``get_unique_id`` returning ``tuple([<char>uniqueId.internal[i] ...])``."""
    _, _, old = surfaces
    assert old["ctor"] == ["ndev", "commId", "rank"] and old["uid"] == ["tuple", 128]


def test_arrays_streams_and_devices_offer_nothing_real_cupy_lacks(surfaces):
    real, double, _ = surfaces
    assert double["flags"] == real["flags"] and "writeable" not in real["flags"]
    assert double["event"] == real["event"]
    assert set(double["stream"]) <= set(real["stream"])
    assert set(double["device"]) <= set(real["device"])
    for key in ("ndarray_get", "ndarray_set", "stream_init"):
        assert double[key] == real[key], key


def test_what_fluidctl_calls_matches_and_instances_carry_the_same_attributes(surfaces):
    """Issue 26: the functions fluidctl calls (with their parameters), CUDA's error texts and
    what a Stream instance carries (real CuPy's is_non_blocking is a property; the double had
    a ``non_blocking`` attribute), not just the class names."""
    real, double, old = surfaces
    for side in (double, old):
        assert side["runtime"] == real["runtime"]
        assert side["runtime_error"] == real["runtime_error"]
        assert side["stream_instance"] == real["stream_instance"] == ["device_id", "ptr"]
        assert side["stream_null"] == real["stream_null"] == [0, -1]
        assert side["calls"] == real["calls"]
        assert side["ndarray_attrs"] == real["ndarray_attrs"]
        assert side["module_functions"] == real["module_functions"]
        assert side["interprocess_timing"] == real["interprocess_timing"]
    assert "is_non_blocking" in real["stream"] and "is_non_blocking" in double["stream"]


def test_fluidctl_never_reaches_into_the_double():
    for path in pathlib.Path(ROOT, "fluidctl").rglob("*.py"):
        text = path.read_text()
        assert "_double" not in text and "cupy_double" not in text, path


def test_real_communicator_takes_fluidctls_id_form_and_fails_on_the_missing_gpu():
    """Up to the communicator with the real library: the id from the store in the form this
    CuPy wants passes the real signature; creating it is what needs a GPU."""
    code = """
import cupy
from cupy.cuda import nccl
from fluidctl.runtime.collective.nccl import encode_unique_id, make_communicator
data = encode_unique_id(nccl.get_unique_id())
try:
    nccl.NcclCommunicator(1, tuple(data), 0)
except TypeError as exc:
    print("tuple refused:", exc)
try:
    nccl.NcclCommunicator(1, data[:100], 0)
except ValueError as exc:
    print("short refused:", exc)
try:
    make_communicator(nccl, cupy, 1, 0, data)
except nccl.NcclError as exc:
    print("created up to:", exc)
"""
    if _real_gpu():
        pytest.skip("a GPU is here: tests/gpu covers the real communicator")
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert "tuple refused:" in res.stdout and "short refused: commId length 100 != 128" in \
        res.stdout
    assert "created up to: NCCL_ERROR_UNHANDLED_CUDA_ERROR" in res.stdout


def test_real_handshake_ends_every_rank_with_the_same_clear_error(tmp_path):
    if _real_gpu():
        pytest.skip("a GPU is here: tests/gpu runs the real handshake")
    envs = rankspawn.rank_envs(2, gpus=["0", "1"], extra={"FLUIDCTL_TIMEOUT": "30"})
    res = rankspawn.Ranks(["tests/gpu_worker.py", "handshake"], envs, str(tmp_path)).wait(60)
    assert res.returncodes == [3, 3], res
    errors = {json.loads(l[7:])["init_error"] for out in res.outputs
              for l in out.splitlines() if l.startswith("RESULT ")}
    assert len(errors) == 1, res
    error = errors.pop()
    assert error.startswith("GPU set-up failed, so no rank starts NCCL: rank 0: cannot use "
                            "GPU 0 (cudaErrorInsufficientDriver"), error
    assert "rank 1: cannot use GPU 1" in error


def test_gpu_stack_line_from_the_real_packages():
    """What cluster check shows per node: from package metadata without GPUs listed, from the
    imported CuPy/NCCL and CUDA when nvidia-smi lists some."""
    from fluidctl.node.gpustack import nccl_version_text
    assert [nccl_version_text(c) for c in (23203, 21805, 2708)] == ["2.32.3", "2.18.5", "2.7.8"]
    cheap = _python("import fluidctl.node.gpustack as g; print(g.describe(0))")
    assert cheap.returncode == 0, cheap.stderr
    assert re.fullmatch(r"CuPy 1\d\.\d+\.\d+, NCCL 2\.\d+\.\d+, no usable GPU\n", cheap.stdout)
    if not _real_gpu():
        full = _python("import fluidctl.node.gpustack as g; print(g.describe(2))")
        assert re.fullmatch(r"CuPy 1\d\.\d+\.\d+, NCCL 2\.\d+\.\d+, no usable GPU "
                            r"\(cudaErrorInsufficientDriver\)\n", full.stdout), full.stdout


