#!/usr/bin/env bash
# One device call that checks the GPU side of the tree as it stands: the harness's cost
# before and after (the older tree in .before, carried), the GPU tests, the adversarial
# CUDA kernels, a user's own kernel folders through the CLI, and a short fp32 search
# whose summary shows the vendor's re-timings and the end-of-run confirmation.
# Wheels in .whl (see ../shared/PERF.md).
#   [ADVERSARIAL=0] bash benchmarks/device_check.sh [SEARCH_SECONDS, 0: no search]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
seconds=${1:-60}
if [ -d .before ]; then
  for label in before after; do
    root=$PWD; [ "$label" = before ] && root=$PWD/.before
    (cd "$root" && PYTHONPATH=/tmp/site:$root python3 benchmarks/cuda_throughput.py \
       --size 4096 --evaluations 30 --label "$label" 2>&1 | tail -4)
  done
fi
python3 -m pytest tests/backends/test_cuda.py tests/backends/test_cuda_compile.py \
  tests/backends/test_cuda_conformance.py tests/backends/test_hip_gpu.py \
  tests/test_validation.py -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
[ "${ADVERSARIAL:-1}" = 1 ] && python3 benchmarks/adversarial_cuda.py 2>&1 | tail -22
for run in softmax:4096x4096 bmm:8x512x512x512 matmul_bt:2048x2048x2048; do
  kernel=${run%%:*}
  python3 -m peak_tune.cli --kernel "$kernel" --catalog "tests/fixtures/catalogs/$kernel" \
    --device h200 --size "${run#*:}" --trials 6 --json --results "/tmp/user-$kernel" \
    >"$OUT/user-$kernel.json" 2>"$OUT/user-$kernel.err"
  echo "user kernel $kernel: exit $?"; tail -2 "$OUT/user-$kernel.err"
  python3 - "$OUT/user-$kernel.json" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
if lines:
    d = json.loads(lines[-1])
    print(" ", d["sizes"], "ratio", d["ratio"], "to", d["ratio_to"], "vendor", d["vendor"].get("name"),
          "peak", d["peak"], d["trials"]["by_outcome"])
PY
done
[ "$seconds" -gt 0 ] && python3 benchmarks/cuda_matmul.py --results /tmp/r-search \
  --out "$OUT/search.json" --trials 20000 --seconds "$seconds" --configs float32:4096 \
  --no-paper --no-triton --confirm 2>&1 | grep -v "^\[I " | tail -6
[ -f "$OUT/search.json" ] && python3 - "$OUT/search.json" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))["rows"][0]["search"]
print("vendor:", json.dumps(row.get("vendor"))[:600])
print("confirmation:", json.dumps(row.get("confirmation"))[:600])
PY
