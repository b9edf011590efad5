#!/usr/bin/env bash
# One device call for issue 16 (HIP on NVIDIA): the HIP GPU tests and compile tests, then
# the HIP search at fp32 4096 and 8192 beside cuBLAS, and the CUDA backend's search at
# the same sizes in the same run. Wheels in .whl (see ../shared/PERF.md).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
seconds=${1:-120}
python3 -m pytest tests/backends/test_hip_gpu.py -q \
  -p no:cacheprovider -x 2>&1 | tail -15 | tee "$OUT/hip_gpu_tests.txt"
python3 benchmarks/hip_matmul.py --device h200 --configs float32:4096,float32:8192 \
  --seconds "$seconds" ${WITH_CUDA:-} --results /tmp/r-hip --out "$OUT/hip_matmul.json" 2>&1 \
  | grep -v "^\[I " | tail -12
python3 benchmarks/study_failures.py /tmp/r-hip 2>&1 | tail -20
