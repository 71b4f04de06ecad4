#!/usr/bin/env bash
# One command for anyone with ten minutes on one H100/H200 (Python 3.12, cupy-cuda13x,
# nvidia-nccl-cu13, torch with CUDA 13; no network, no install: runs from this working tree):
#
#     tests/gpu/one_gpu_check.sh [REPORT]            # writes $OUT/gpu-check.txt (or ./, or REPORT)
#     tests/gpu/one_gpu_check.sh --double [REPORT]   # dry run without a GPU, on tests/cupy_double
#
# Versions first, then one PASS/FAIL/SKIP line per step (see tests/gpu/one_gpu_check.py).
# Exit 0 when nothing failed. PYTHON picks the interpreter (default python3).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
args=()
double=0
for a in "$@"; do
    if [ "$a" = "--double" ]; then double=1; else args+=("$a"); fi
done
[ "${FLUIDCTL_GPU_CHECK_DOUBLE:-0}" = "1" ] && double=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if [ "$double" = "1" ]; then
    # the strict CuPy/NCCL double, one fake GPU that nvidia-smi lists for fluidctl train
    fake="$(mktemp -d)"
    trap 'rm -rf "$fake"' EXIT
    printf '#!/bin/sh\nif [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"; else echo "0, NVIDIA H100 80GB HBM3 (double), 0.0, 00000000:10:00.0, 81559 MiB"; fi\n' > "$fake/nvidia-smi"
    chmod +x "$fake/nvidia-smi"
    export PATH="$fake:$PATH" PYTHONPATH="$root/tests/cupy_double:$PYTHONPATH"
    export FLUIDCTL_GPU_CHECK_DOUBLE=1 FLUIDCTL_GPU_CHECK_FAKE_SMI="$fake" CUPY_DOUBLE_GPUS=1
    unset CUDA_VISIBLE_DEVICES
fi
cd "$root" && "$py" tests/gpu/one_gpu_check.py ${args[@]+"${args[@]}"}
