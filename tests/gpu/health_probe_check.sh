#!/usr/bin/env bash
# The deep check's node probe on one GPU machine (no SSH, no install: this working tree):
# one cpu, one disk and one gpu request, answers printed as JSON lines.
#     tests/gpu/health_probe_check.sh            # PYTHON picks the interpreter (python3)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root" && nvidia-smi -L
printf '%s\n' '{"op": "cpu"}' '{"op": "disk", "dir": "/tmp"}' '{"op": "gpu", "seconds": 0.5}' \
    | OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 120 "${PYTHON:-python3}" \
      -m fluidctl.node.healthprobe 100
