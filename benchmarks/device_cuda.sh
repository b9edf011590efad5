#!/usr/bin/env bash
# One device call: the CUDA GPU tests, then the H200 search benchmark. Optuna and the
# other wheels the device lacks travel in .whl (see ../shared/PERF.md).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest tests/backends/test_cuda.py tests/backends/test_cuda_compile.py -q \
  -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
python3 benchmarks/cuda_matmul.py --results /tmp/bench-results --out "$OUT/cuda_matmul.json" \
  "$@" 2>&1 | grep -v "^\[I " | tail -40
cp -r /tmp/bench-results/profiles "$OUT/" 2>/dev/null || true
