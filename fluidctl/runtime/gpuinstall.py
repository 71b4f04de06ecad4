"""What to install for a GPU rank, by the CUDA major version of the CuPy at hand: CuPy loads
NCCL only from the ``nvidia-nccl-cuXX`` wheel of its own CUDA major (or a system libnccl), and
fluidctl's extras pair them (``gpu`` = ``gpu-cuda12``: cupy-cuda12x + nvidia-nccl-cu12;
``gpu-cuda13``: cupy-cuda13x + nvidia-nccl-cu13). Standard library only: ``cluster check``
runs it on every node."""
from __future__ import annotations

from typing import Optional

CUPY_DISTS = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")
NCCL_DISTS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")
EXTRAS = {12: "gpu-cuda12", 13: "gpu-cuda13"}


def installed(names) -> tuple:
    """(distribution, version) of the first of ``names`` installed, else ('', '')."""
    from importlib import metadata
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "", ""


def cuda_major_of_dist(dist: str) -> Optional[int]:
    """12 for cupy-cuda12x, 13 for cupy-cuda13x; None for a source build ('cupy')."""
    if dist.startswith("cupy-cuda") and dist.endswith("x") and dist[9:-1].isdigit():
        return int(dist[9:-1])
    return None


def cuda_major_of(cupy) -> Optional[int]:
    """The CUDA major an imported CuPy was built for (cudaRuntimeGetVersion: no GPU needed)."""
    try:
        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    except Exception:
        return cuda_major_of_dist(installed(CUPY_DISTS)[0])


def nccl_hint(cuda_major: Optional[int]) -> str:
    """'pip install nvidia-nccl-cu13, or pip install 'fluidctl[gpu-cuda13]'' for CUDA 13."""
    major = cuda_major or 12
    extra = EXTRAS.get(major)
    return f"pip install nvidia-nccl-cu{major}" + (
        f", or pip install 'fluidctl[{extra}]'" if extra else "")


def cupy_hint(cuda_major: Optional[int] = None) -> str:
    """What to install when CuPy is missing (CUDA 12 unless told)."""
    extra = EXTRAS.get(cuda_major or 12, "gpu")
    return f"pip install 'fluidctl[{extra}]'"


def nccl_version_text(code: int) -> str:
    """ncclGetVersion's integer as x.y.z (2.9+ encode X*10000+Y*100+Z, older X*1000+Y*100+Z)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
