"""tests/gpu: the real-GPU suite (``python -m pytest -m gpu`` on a machine with NVIDIA GPUs,
CuPy and NCCL: pip install -e '.[gpu,test]'). Everything here is marked ``gpu`` and skipped,
with one line saying why, where nvidia-smi finds no GPU or the real CuPy cannot use it."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))           # tests/ (rankspawn)

_SMI = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(\S+?)\)")


def smi_gpus():
    """[(index, uuid, pci bus id)] as nvidia-smi lists them, or the reason there are none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"no nvidia-smi here ({type(exc).__name__})"
    rows = [tuple(v.strip() for v in line.split(",")) for line in out.stdout.splitlines()
            if line.count(",") == 2]
    if out.returncode != 0 or not rows:
        return None, "nvidia-smi finds no GPU"
    return rows, ""


def _cupy_usable():
    code = "import cupy; cupy.cuda.runtime.getDeviceCount(); from cupy.cuda import nccl; " \
           "assert nccl.available, 'cupy.cuda.nccl.available is False'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    return res.returncode == 0, (res.stderr.strip().splitlines() or ["?"])[-1]


def pytest_collection_modifyitems(config, items):
    mine = [i for i in items if str(i.fspath).startswith(HERE)]
    if not mine:
        return
    gpus, why = smi_gpus()
    if gpus:
        ok, err = _cupy_usable()
        if not ok:
            why = f"CuPy cannot use the GPU here ({err}); pip install -e '.[gpu,test]'"
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if why:
            item.add_marker(pytest.mark.skip(reason=f"real-GPU suite: {why}"))


@pytest.fixture(scope="session")
def gpus():
    rows, _ = smi_gpus()
    return rows
