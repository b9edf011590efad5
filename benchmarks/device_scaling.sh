#!/usr/bin/env bash
# One device call on nvidia-h200-x2 or -x4 (args: trials, sizes, seconds per worker count,
# dtypes): the driver's own ceiling on this host (driver_throughput.py), then trials per
# minute of one CUDA study with 1 and 2 GPU workers (WORKERS, e.g. 1,2,4) on Ray at each
# size and dtype, side by side in one run. The
# wheels travel in .whl, made with
#   ../shared/tools/device-wheels.sh .whl optuna==5.0.0 ray==2.60.0 alembic sqlalchemy \
#     colorlog mako greenlet jsonschema jsonschema-specifications referencing rpds-py \
#     rich markdown-it-py mdurl pygments threadpoolctl cmaes PyYAML typing-extensions
# (see ../shared/PERF.md). The LLM half of scaling.py needs no GPU: it runs on the CPU.
# REPEATS (default 5) sets the timed runs per evaluation: more makes the GPUs, not the
# driver, the limit. Each dtype and size's full log is kept in $OUT.
set -uo pipefail
# 2 dtypes x 2 sizes x 2 worker counts x 45 s, after the driver's 150 s: a 600 s call
trials=${1:-600} sizes=${2:-"4096 8192"} seconds=${3:-45} dtypes=${4:-"float32 float16"}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
# the device profile of the GPUs lent (H100 or H200)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
if [ "${DRIVER:-1}" = 1 ]; then
  timeout 150 python3 benchmarks/driver_throughput.py --trials 300 --build-workers 16 \
    --out "$OUT/driver_throughput.json" 2>&1 | grep -v "^\[I " | tail -4
fi
workers=${WORKERS:-1,2}
counts=$(echo "$workers" | tr ',' ' ' | wc -w)
for dtype in $dtypes; do
  for size in $sizes; do  # each worker count is time-boxed and written to $OUT when done
    # a hard stop too: in-flight jobs drain after the box, and a call must not run out
    timeout $(((counts + 1) * seconds + 60)) python3 benchmarks/scaling.py --seconds "$seconds" \
      --backend cuda --device "$device" --dtype "$dtype" --size "$size" --trials "$trials" \
      --repeats "${REPEATS:-5}" --workers "$workers" --skip-llm \
      --out "$OUT/scaling-$dtype-$size.json" > "$OUT/scaling-$dtype-$size.log" 2>&1
    grep -v "^\[I " "$OUT/scaling-$dtype-$size.log" | grep -v "logging.cc" | tail -8
  done
done
# What is left of the call: the fp16 search on one GPU (FP16_SECONDS=0 skips it).
left=$((540 - SECONDS - 60))
if [ "${FP16_SECONDS:-0}" -gt 0 ] && [ "$left" -gt 60 ]; then
  box=$(( left < FP16_SECONDS ? left : FP16_SECONDS ))
  CUDA_VISIBLE_DEVICES=0 timeout $((box + 50)) python3 benchmarks/cuda_matmul.py \
    --results /tmp/bench-results --out "$OUT/cuda_matmul.json" --trials 5000 \
    --seconds "$box" --configs float16:4096 --no-paper --no-triton 2>&1 | grep -v "^\[I " | tail -8
fi
