#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (args: trials, size, seconds): trials per minute of one CUDA study with 1 and 2
# GPU workers (Ray), side by side in one run. The wheels travel in .whl, made with
#   ../shared/tools/device-wheels.sh .whl optuna==5.0.0 ray==2.60.0 alembic sqlalchemy \
#     colorlog mako greenlet jsonschema jsonschema-specifications referencing rpds-py \
#     rich markdown-it-py mdurl pygments threadpoolctl cmaes PyYAML typing-extensions
# (see ../shared/PERF.md). The LLM half of scaling.py needs no GPU: it runs on the CPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# each worker count is time-boxed (--seconds) and written to $OUT as soon as it is done
python3 benchmarks/scaling.py --seconds "${3:-120}" --backend cuda --device h200 --size "${2:-4096}" --trials "${1:-200}" \
  --repeats 5 --workers 1,2 --skip-llm --out "$OUT/scaling.json" 2>&1 | grep -v "^\[I " | tail -20
