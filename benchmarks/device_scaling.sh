#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (args: trials, sizes, seconds per worker count): the
# driver's own ceiling on this host (driver_throughput.py), then trials per minute of one
# CUDA study with 1 and 2 GPU workers (Ray) at each size, side by side in one run. The
# wheels travel in .whl, made with
#   ../shared/tools/device-wheels.sh .whl optuna==5.0.0 ray==2.60.0 alembic sqlalchemy \
#     colorlog mako greenlet jsonschema jsonschema-specifications referencing rpds-py \
#     rich markdown-it-py mdurl pygments threadpoolctl cmaes PyYAML typing-extensions
# (see ../shared/PERF.md). The LLM half of scaling.py needs no GPU: it runs on the CPU.
# REPEATS (default 5) sets the timed runs per evaluation: more makes the GPUs, not the
# driver, the limit. Each size's full log is kept in $OUT.
set -uo pipefail
trials=${1:-600} sizes=${2:-"4096 8192"} seconds=${3:-90}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
if [ "${DRIVER:-1}" = 1 ]; then
  timeout 150 python3 benchmarks/driver_throughput.py --trials 300 --build-workers 16 \
    --out "$OUT/driver_throughput.json" 2>&1 | grep -v "^\[I " | tail -4
fi
for size in $sizes; do  # each worker count is time-boxed and written to $OUT when done
  # a hard stop too: in-flight jobs drain after the box, and a call must not run out
  timeout $((3 * seconds + 60)) python3 benchmarks/scaling.py --seconds "$seconds" --backend cuda --device h200 \
    --size "$size" --trials "$trials" --repeats "${REPEATS:-5}" --workers 1,2 --skip-llm \
    --out "$OUT/scaling-$size.json" > "$OUT/scaling-$size.log" 2>&1
  grep -v "^\[I " "$OUT/scaling-$size.log" | grep -v "logging.cc" | tail -8
done
# What is left of the call: the fp16 search on one GPU (FP16_SECONDS=0 skips it).
left=$((540 - SECONDS - 60))
if [ "${FP16_SECONDS:-0}" -gt 0 ] && [ "$left" -gt 60 ]; then
  box=$(( left < FP16_SECONDS ? left : FP16_SECONDS ))
  CUDA_VISIBLE_DEVICES=0 timeout $((box + 50)) python3 benchmarks/cuda_matmul.py \
    --results /tmp/bench-results --out "$OUT/cuda_matmul.json" --trials 5000 \
    --seconds "$box" --configs float16:4096 --no-paper --no-triton 2>&1 | grep -v "^\[I " | tail -8
fi
