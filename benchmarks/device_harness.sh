#!/usr/bin/env bash
# One device call for issue 15: the hardened harness's cost before and after (the older
# tree in .before, carried), the GPU tests, the adversarial CUDA kernels, and a short
# fp32 4096 search with each tree (none when the seconds given are 0). Wheels in .whl
# (see ../shared/PERF.md).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
seconds=${1:-60}
for round in 1 2; do
  for label in before after; do
    root=$PWD; [ "$label" = before ] && root=$PWD/.before
    (cd "$root" && PYTHONPATH=/tmp/site:$root python3 benchmarks/cuda_throughput.py \
       --size 4096 --evaluations 30 --label "$label-$round" 2>&1 | tail -8)
  done
done
PYTHONPATH=/tmp/site:$PWD python3 -m pytest tests/backends/test_cuda.py \
  tests/backends/test_cuda_compile.py tests/backends/test_cuda_conformance.py \
  tests/backends/test_hip_gpu.py tests/test_validation.py -q -p no:cacheprovider 2>&1 \
  | tail -25 | tee "$OUT/gpu_tests.txt"
if [ -f benchmarks/adversarial_cuda.py ]; then
  PYTHONPATH=/tmp/site:$PWD python3 benchmarks/adversarial_cuda.py 2>&1 | tail -40
fi
[ "$seconds" = 0 ] && exit 0
for label in before after; do
  root=$PWD; [ "$label" = before ] && root=$PWD/.before
  (cd "$root" && PYTHONPATH=/tmp/site:$root python3 benchmarks/cuda_matmul.py \
     --results /tmp/r-$label --out "$OUT/search-$label.json" --trials 20000 \
     --seconds "$seconds" --configs float32:4096 --no-paper --no-triton 2>&1 \
     | grep -v "^\[I " | tail -6)
done
# fp16 with the tighter tolerance (5e-5 of |A|@|B| plus the output's rounding): the
# search's own kernels must still pass (by_outcome shows the wrong results)
PYTHONPATH=/tmp/site:$PWD python3 benchmarks/cuda_matmul.py --results /tmp/r-fp16 \
  --out "$OUT/search-fp16-after.json" --trials 20000 --seconds "$seconds" \
  --configs float16:4096 --no-paper --no-triton 2>&1 | grep -v "^\[I " | tail -4
PYTHONPATH=/tmp/site:$PWD python3 benchmarks/study_failures.py /tmp/r-fp16
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("search-*.json")):
    row = json.loads(f.read_text())["rows"][0]["search"]
    print(f.name, row["ratio"], row["trials"]["by_outcome"])
PY
