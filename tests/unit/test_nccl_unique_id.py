"""NCCL unique id forms in-process: the C char signedness of the machine, and the tuple CuPy 13
accepts."""
import os
import sys

import pytest

from fluidctl.runtime.collective.nccl import (char_is_signed, decode_unique_id,
                                              encode_unique_id, make_communicator)

import rankspawn

DOUBLE = os.path.join(rankspawn.ROOT, "tests", "cupy_double")


# --- 3: the unique id -----------------------------------------------------------------------
def test_unique_id_forms_follow_the_c_char_of_the_machine():
    signed = tuple(range(-128, 0)) + tuple(range(0, 128))
    data = encode_unique_id(signed)
    assert isinstance(data, bytes) and len(data) == 256
    assert decode_unique_id(data, as_bytes=False, signed=True) == signed
    unsigned = tuple(range(256))
    assert encode_unique_id(unsigned) == bytes(range(256))
    assert decode_unique_id(bytes(range(256)), False, signed=False) == unsigned
    assert char_is_signed("x86_64") and not char_is_signed("aarch64")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_cupy13_gets_a_tuple_its_char_accepts(machine, monkeypatch):
    """CuPy <= 13 copies the tuple into C char: on aarch64 (GH200) char is unsigned, and a
    negative value raised OverflowError, uncaught (3)."""
    import importlib
    sys.path.insert(0, DOUBLE)
    try:
        for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setenv("CUPY_DOUBLE_VERSION", "13.6.0")
        monkeypatch.setattr("platform.machine", lambda: machine)
        cupy = importlib.import_module("cupy")
        nccl = importlib.import_module("cupy.cuda.nccl")
        assert nccl._CHAR_SIGNED == (machine == "x86_64")
        uid = nccl.get_unique_id()
        assert isinstance(uid, tuple) and len(uid) == 128
        data = encode_unique_id(uid)
        comm = make_communicator(nccl, cupy, 1, 0, data)
        assert comm.rank_id() == 0 and comm.size() == 1
        comm.destroy()
        with pytest.raises(Exception):              # the double is strict about the form
            nccl.NcclCommunicator(1, data, 0)
    finally:
        sys.path.remove(DOUBLE)
        for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
            del sys.modules[name]
