"""Evaluations per second of the CUDA backend for one good fp32 (or fp16) matmul variant.

The paper-like fp32 sequence (`--dtype float16`: the Hopper wgmma + tma-store one;
reference applier, hand-picked values, a few block-swizzle group sizes as the "fresh"
tuning points, compiled up front) is evaluated again and again at --size through the
backend's worker: validation at the spec's check sizes and twice at the size, warm-up and
timed runs, the output checked after timing, as in a search. The first evaluation
(inputs and float64 references made for the first time) is reported apart; the rest
give evaluations per second and the worker's time per phase.
Prints a short table last and writes JSON to $OUT (or ./results).

    python3 benchmarks/cuda_throughput.py [--size 4096] [--evaluations 20] [--label after]

For a before/after in one run, run this script from a copy of the older tree too
(`git archive HEAD peak_tune seeds backends transforms | tar -x -C .before`, copy this
file into .before/benchmarks/, then `cd .before && python3 benchmarks/cuda_throughput.py
--label before`): the worker starts with `python -m`, which imports the package from the
current directory first, so run each copy from its own root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.appliers.reference.cuda_matmul import apply_transformation  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend, profile_for_gpu, visible_gpu  # noqa: E402
from peak_tune.backends.wire import measurement_from_reply  # noqa: E402
from peak_tune.catalog.loaders import load_devices, load_spec, load_transformations  # noqa: E402
from peak_tune.catalog.types import DeviceProfile  # noqa: E402
from peak_tune.core import ProblemSize  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from compile_flags import TMA_STORE  # noqa: E402

PAPER_FP32 = ("refactor", "tb-tiling", "thread-tiling", "thread-cache", "warp-tiling",
              "transpose", "offset", "vector-loads", "pipelining", "block-swizzle")
SIMT = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 16, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
        "WARP_X_DIM": 4, "OFFSET_AMOUNT": 4, "NUM_STAGES": 3, "SWIZZLE_GROUP": 8}
SWIZZLE_GROUPS = (8, 4, 2, 16)  # the tuning points cycled through


def this_gpu_profile() -> DeviceProfile:
    name, arch = visible_gpu()
    found = profile_for_gpu(name, arch, load_devices([ROOT / "backends" / "devices"]).values())
    if found is None:
        raise SystemExit(f"no device profile for {name} ({arch})")
    return found


def evaluate(backend: CudaBackend, artifact: Any, request: EvalRequest) -> dict[str, Any]:
    """backend.evaluate's worker call, keeping the reply (phases_ms, where the worker
    gives them) that backend.evaluate folds into a Measurement."""
    backend._device_info()  # noqa: SLF001  (the worker started, as evaluate does)
    reply = backend._runner.call(  # noqa: SLF001
        backend._request(artifact, request, request.size), request.config.timeout_s)  # noqa: SLF001
    measurement = measurement_from_reply(request.spec, request.size, reply)
    return {"median_ms": measurement.median_ms, "phases_ms": reply.get("phases_ms", {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--evaluations", type=int, default=20)
    parser.add_argument("--label", default="after")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                        help="float16: the Hopper wgmma kernel instead of the SIMT one")
    args = parser.parse_args()
    # --dtype float16: the best fp16 kernel on Hopper (wgmma, tma, tma-store), as
    # compile_flags.py builds it
    sequence, table = (PAPER_FP32, SIMT) if args.dtype == "float32" else TMA_STORE
    device = this_gpu_profile()
    spec = load_spec(ROOT / "seeds" / "matmul")
    catalog = load_transformations([ROOT / "transforms"])
    context = seed_context(spec, "cuda")
    for tid in sequence:
        context = apply_transformation(context, catalog[tid], device)
    size = ProblemSize.of({"M": args.size, "N": args.size, "K": args.size})
    config = EvalConfig(timeout_s=120.0)  # the search's defaults: 1 warm-up, 7 repeats
    build = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-cuda-throughput"
    result: dict[str, Any] = {**provenance(), "label": args.label, "size": size.as_dict(),
                              "config": {"warmup": config.warmup, "repeats": config.repeats}}
    with CudaBackend(device) as backend:
        result["fingerprint"] = dict(backend.fingerprint())
        started = time.perf_counter()
        points = []
        for group in SWIZZLE_GROUPS:
            params = {p.name: {**table, "SWIZZLE_GROUP": group}[p.name] for p in context.params}
            artifact = backend.compile(context, params, args.dtype, str(build))
            points.append((artifact, EvalRequest(spec, context, params, args.dtype, size,
                                                 spec.check_sizes, config)))
        result["compile_s"] = time.perf_counter() - started
        started = time.perf_counter()
        result["first"] = evaluate(backend, *points[0])
        result["first_s"] = time.perf_counter() - started
        runs = []
        started = time.perf_counter()
        for index in range(args.evaluations):
            runs.append(evaluate(backend, *points[index % len(points)]))
        elapsed = time.perf_counter() - started
    result["evaluations"] = runs
    result["evaluations_per_s"] = args.evaluations / elapsed
    phases = {k: statistics.median(r["phases_ms"].get(k, 0.0) for r in runs)
              for k in sorted({k for r in runs for k in r["phases_ms"]})}
    result["median_phases_ms"] = phases
    out = Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cuda_throughput-{args.dtype}-{args.label}.json").write_text(
        json.dumps(result, indent=1))
    kernel = statistics.median(r["median_ms"] for r in runs)
    print(f"{args.label}: {result['fingerprint']['device']}, n = {args.size}, "
          f"{args.dtype}, kernel {kernel:.2f} ms; first evaluation {result['first_s']:.1f} s; "
          f"{result['evaluations_per_s']:.2f} evaluations/s over {args.evaluations} "
          f"({1e3 / result['evaluations_per_s']:.0f} ms each); worker phases (median ms): "
          + (", ".join(f"{k} {v:.1f}" for k, v in phases.items()) or "not reported"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
