"""The CUDA backend on this machine's GPU: naive seed vs cuBLAS, fp32 and fp16.

Both are validated and timed by the backend (CUDA events, L2 flushed between repeats,
median), in the same worker process, in one run; the ratio is what to compare across
runs. cupy.matmul is timed too, by plain CUDA events in this process, as a cross-check
of the cuBLAS figure. Prints a short table last and writes JSON to $OUT (or ./results).

    python3 benchmarks/cuda_backend_smoke.py [--size 4096] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.catalog.loaders import load_devices, load_spec  # noqa: E402
from peak_tune.catalog.types import DeviceProfile  # noqa: E402
from peak_tune.core import Measurement, ProblemSize  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402


def this_gpu_profile() -> DeviceProfile:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    arch = f"sm_{props['major']}{props['minor']}"
    profiles = [p for p in load_devices([ROOT / "backends" / "devices"]).values()
                if p.backend == "cuda" and str(p.facts.get("arch", "")).rstrip("a") == arch]
    named = [p for p in profiles if p.name.upper() in name.upper()]
    if not (named or profiles):
        raise SystemExit(f"no device profile for {name} ({arch})")
    return (named or profiles)[0]


def cupy_matmul_tflops(dtype: str, n: int, repeats: int) -> float:
    """cupy.matmul, median of `repeats` event-timed calls, L2 flushed before each."""
    import cupy
    import numpy as np

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.uniform(-1, 1, (n, n)).astype(dtype))
    b = cupy.asarray(rng.uniform(-1, 1, (n, n)).astype(dtype))
    c = cupy.empty((n, n), dtype)
    flush = cupy.empty(256 << 20, cupy.uint8)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    cupy.matmul(a, b, out=c)
    samples = []
    for i in range(repeats):
        flush.fill(i % 256)
        start.record()
        cupy.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end))
    return 2 * n**3 / (float(np.median(samples)) * 1e-3) / 1e12


def row(measurement: Measurement) -> dict[str, Any]:
    return {"median_ms": measurement.median_ms, "gflops": measurement.gflops,
            "spread": measurement.spread, "samples_ms": list(measurement.samples_ms)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    spec = load_spec(ROOT / "seeds" / "matmul")
    size = ProblemSize.of({"M": args.size, "N": args.size, "K": args.size})
    config = EvalConfig(timeout_s=300.0, warmup=2, repeats=args.repeats, max_timing_s=30.0)
    profile = this_gpu_profile()
    results: dict[str, Any] = {**provenance(), "size": size.as_dict(), "runs": {}}
    with CudaBackend(profile) as backend:
        results["fingerprint"] = dict(backend.fingerprint())
        build = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-cuda-smoke"
        for dtype in ("float32", "float16"):
            context = seed_context(spec, "cuda")
            artifact = backend.compile(context, {}, dtype, str(build))
            request = EvalRequest(spec=spec, context=context, params={}, dtype=dtype,
                                  size=size, check_sizes=spec.check_sizes, config=config)
            naive = backend.evaluate(artifact, request)
            vendor_name, vendor = backend.time_vendor(spec, dtype, size, config)
            results["runs"][dtype] = {
                "naive": {**row(naive), "resources": dict(artifact.resources)},
                "vendor": {"name": vendor_name, **row(vendor)},
                "naive_over_vendor": naive.gflops / vendor.gflops,
                "cupy_matmul_tflops": cupy_matmul_tflops(dtype, args.size, args.repeats),
            }
    out = Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_backend_smoke.json").write_text(json.dumps(results, indent=2))
    print(f"{results['fingerprint']['device']}, driver {results['fingerprint']['driver']}, "
          f"{results['fingerprint']['compiler']}, n = {args.size}")
    print(f"{'dtype':8} {'naive GFLOP/s':>14} {'cuBLAS GFLOP/s':>15} {'ratio':>7} "
          f"{'cupy.matmul':>12}  cuBLAS call")
    for dtype, run in results["runs"].items():
        print(f"{dtype:8} {run['naive']['gflops']:14.1f} {run['vendor']['gflops']:15.1f} "
              f"{run['naive_over_vendor']:7.3f} {run['cupy_matmul_tflops'] * 1e3:12.1f}  "
              f"{run['vendor']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
