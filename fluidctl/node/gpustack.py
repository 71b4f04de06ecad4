"""One line on what a GPU rank would get on this node: ``python -m fluidctl.node.gpustack GPUS``
prints e.g. ``CuPy 14.2.0, NCCL 2.32.3, no usable GPU`` (what ``cluster check`` shows).

Cheap where it can be: versions come from the installed distributions' metadata; CuPy and NCCL
are only imported (and the devices counted through CUDA) when nvidia-smi listed GPUs
(``GPUS`` > 0), since importing CuPy costs seconds on a loaded node.
"""
from __future__ import annotations

import sys

from fluidctl.runtime.gpuinstall import (CUPY_DISTS, NCCL_DISTS, cuda_major_of,  # noqa: F401
                                         cuda_major_of_dist, cupy_hint, installed, nccl_hint,
                                         nccl_version_text)


def _version(names) -> str:
    return installed(names)[1]


def describe(gpus_listed: int) -> str:
    if gpus_listed <= 0:
        dist, cupy = installed(CUPY_DISTS)
        nccl = _version(NCCL_DISTS)
        major = cuda_major_of_dist(dist)
        return ", ".join([f"CuPy {cupy}" if cupy else f"no CuPy ({cupy_hint()})",
                          f"NCCL {nccl}" if nccl else f"no NCCL ({nccl_hint(major)})",
                          "no usable GPU"])
    try:
        import cupy
    except ImportError:
        return f"no CuPy ({cupy_hint()})"
    except Exception as exc:                    # a broken install says why
        return f"CuPy does not import ({type(exc).__name__}: {exc})"
    parts = [f"CuPy {cupy.__version__}"]
    try:
        from cupy.cuda import nccl
        parts.append(f"NCCL {nccl_version_text(nccl.get_version())}" if nccl.available
                     else f"no NCCL ({nccl_hint(cuda_major_of(cupy))})")
    except Exception as exc:
        parts.append(f"no NCCL ({exc})")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        parts.append(f"{count} usable GPU(s)" if count else "no usable GPU")
    except Exception as exc:
        parts.append(f"no usable GPU ({str(exc).split(':')[0]})")
    return ", ".join(parts)


def main(argv) -> None:
    """``[--probe] GPUS``: the line; with --probe, as cluster check's key=value lines (with
    fluidctl's version, so the node check starts one interpreter for both)."""
    probe = "--probe" in argv
    words = [a for a in argv if a != "--probe"]
    gpus = int(words[0]) if words and words[0].isdigit() else 0
    if probe:
        from fluidctl import __version__
        print(f"fluidctl={__version__}", flush=True)
        print(f"gpu_stack={describe(gpus)}")
    else:
        print(describe(gpus))


if __name__ == "__main__":
    main(sys.argv[1:])
