"""The adversarial CUDA kernels on this machine's GPU: every fixture under
tests/fixtures/adversarial_cuda, validated and timed by CudaBackend as a variant would be,
each followed by the naive seed in the same worker (it must still be accepted: no
misattribution after a cheat). Every fixture cheats or faults, so each must end rejected
(wrong result, crash, timeout, or a compile error for one that must not build). Prints a
table and writes JSON to $OUT/adversarial_cuda.json (or ./results).

    python3 benchmarks/adversarial_cuda.py [--size 512] [--timeout 20] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from benchmarks.cuda_backend_smoke import this_gpu_profile  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.catalog.loaders import load_spec  # noqa: E402
from peak_tune.core import KernelContext, KernelSpec, ProblemSize  # noqa: E402
from peak_tune.errors import EvaluationError, InvalidPoint  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "adversarial_cuda"


def evaluate(backend: CudaBackend, spec: KernelSpec, context: KernelContext, dtype: str,
             size: ProblemSize, config: EvalConfig, build: Path) -> dict[str, Any]:
    """{"outcome": "ok"|error class, "message": ..., "gflops": ...} for one evaluation."""
    started = time.perf_counter()
    try:
        artifact = backend.compile(context, {}, dtype, str(build))
        request = EvalRequest(spec=spec, context=context, params={}, dtype=dtype, size=size,
                              check_sizes=spec.check_sizes, config=config)
        measurement = backend.evaluate(artifact, request)
    except (EvaluationError, InvalidPoint) as exc:
        return {"outcome": type(exc).__name__, "message": str(exc).splitlines()[0][:300],
                "seconds": round(time.perf_counter() - started, 2)}
    return {"outcome": "ok", "gflops": measurement.gflops,
            "samples_ms": list(measurement.samples_ms),
            "seconds": round(time.perf_counter() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    spec = load_spec(ROOT / "seeds" / "matmul")
    size = ProblemSize.of({"M": args.size, "N": args.size, "K": args.size})
    config = EvalConfig(timeout_s=args.timeout, warmup=1, repeats=7, max_timing_s=3.0)
    seed = seed_context(spec, "cuda")
    build = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-adversarial-cuda"
    results: dict[str, Any] = {**provenance(), "size": size.as_dict(), "dtype": args.dtype,
                               "kernels": {}}
    with CudaBackend(this_gpu_profile()) as backend:
        results["fingerprint"] = dict(backend.fingerprint())
        results["naive_first"] = evaluate(backend, spec, seed, args.dtype, size, config, build)
        for path in sorted(FIXTURES.glob("*.cu")):
            context = KernelContext(kernel="matmul", backend="cuda", source=path.read_text(),
                                    entry="matmul", launch=dict(seed.launch))
            got = evaluate(backend, spec, context, args.dtype, size, config, build)
            after = evaluate(backend, spec, seed, args.dtype, size, config, build)
            results["kernels"][path.stem] = {
                **got, "rejected": got["outcome"] != "ok",
                "naive_after": after, "naive_after_ok": after["outcome"] == "ok"}
    out = Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "adversarial_cuda.json").write_text(json.dumps(results, indent=2))
    print(f"{results['fingerprint'].get('device')}, {args.dtype}, n = {args.size}; naive "
          f"{results['naive_first'].get('gflops', 0):.0f} GFLOP/s")
    print(f"{'kernel':28} {'verdict':10} {'outcome':14} naive after  message")
    for name, row in results["kernels"].items():
        verdict = "rejected" if row["rejected"] else "ACCEPTED"
        shown = row.get("message", f"{row.get('gflops', 0):.0f} GFLOP/s")
        naive = "ok" if row["naive_after_ok"] else row["naive_after"]["outcome"]
        print(f"{name:28} {verdict:10} {row['outcome']:14} {naive:12} {shown[:70]}")
    rejected = sum(r["rejected"] for r in results["kernels"].values())
    print(f"{rejected} of {len(results['kernels'])} rejected; the seed after each: "
          f"{sum(r['naive_after_ok'] for r in results['kernels'].values())} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
