"""HIP benchmark: the search over HIP kernels against the vendor BLAS, in one run.

On the H200 (HIP on NVIDIA: HIP sources through peak-tune's HIP-on-CUDA header and
NVRTC, timed by the CUDA worker) the vendor is cuBLAS, timed by the same harness in the
same worker; `--with-cuda` adds the CUDA backend's own search at each size for
comparison (it has the NVIDIA-only steps the HIP one does not). On an AMD GPU
(`--device mi250 | mi250x | mi300x`) the vendor is hipBLAS; this version does not run
kernels on AMD GPUs yet, so there the script stops at the backend's one-line reason.

    python benchmarks/hip_matmul.py --device h200 --configs float32:4096,float32:8192
    python benchmarks/hip_matmul.py --device mi250 \\
        --configs float32:2048,float32:4096,float32:8192,float16:2048,float16:4096,float16:8192

Writes JSON (date, device, driver, command, rows) to --out and prints a table of ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_matmul import _driver, study_row  # noqa: E402
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.errors import UserError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--configs", default="float32:4096,float32:8192")
    parser.add_argument("--trials", type=int, default=20000, help="trials per search at most")
    parser.add_argument("--seconds", type=float, default=150, help="time box per search")
    parser.add_argument("--with-cuda", action="store_true",
                        help="also the CUDA backend's search at each size (NVIDIA only)")
    parser.add_argument("--warm-start", action="store_true",
                        help="start each search from the best of the dtype's search before "
                             "(4096 -> 8192), as a user tuning several sizes would")
    parser.add_argument("--results", default="results-hip-bench")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "hip_matmul.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    record: dict[str, Any] = {
        "benchmark": "hip_matmul", **provenance(), "device": _driver(),
        "rows": rows}
    searched: dict[str, str] = {}  # dtype -> its last HIP search study (--warm-start)
    for config in args.configs.split(","):
        dtype, n = config.split(":")
        row: dict[str, Any] = {"dtype": dtype, "n": int(n)}
        warm = (searched[dtype],) if args.warm_start and dtype in searched else ()
        try:
            row["hip"] = study_row(dtype, int(n), args.trials, Path(args.results),
                                   args.seconds, backend="hip", device=args.device,
                                   warm_start=warm)
            row["hip"]["warm_start"] = list(warm)
            searched[dtype] = row["hip"]["study"]
            if args.with_cuda:
                row["cuda"] = study_row(dtype, int(n), args.trials, Path(args.results),
                                        args.seconds, backend="cuda", device=args.device)
        except UserError as exc:
            print(f"hip_matmul: {exc}", file=sys.stderr)
            return 2
        rows.append(row)
        Path(args.out).write_text(json.dumps(record, indent=1))
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")
    print(f"{'dtype':<8} {'n':>5} {'backend':>7} {'ratio':>7} {'best GFLOP/s':>12} "
          f"{'vendor':>9} {'trials':>6}  best sequence")
    for r in rows:
        for backend in ("hip", "cuda"):
            if backend in r:
                s = r[backend]
                print(f"{r['dtype']:<8} {r['n']:>5} {backend:>7} {s['ratio'] or 0:>7.3f} "
                      f"{s['best']['gflops']:>12.0f} {s['vendor']['gflops']:>9.0f} "
                      f"{s['trials']['total']:>6}  {' > '.join(s['best']['sequence'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
