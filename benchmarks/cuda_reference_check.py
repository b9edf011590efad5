"""The CUDA reference transformations on this machine's GPU, side by side with cuBLAS.

Builds transformation sequences with the reference applier (fixed tuning values), then
compiles, validates and times each through the CUDA backend: validation at odd sizes
(the spec's check sizes and a few smaller ones: empty split-K slices, one element) and
twice at the timed size, CUDA events with L2 flushed, median, the output checked again
after timing. cuBLAS is timed by the same worker in the same run.

Sections: coverage (every transformation after a short prefix, validated at small and
odd sizes, fp32, fp16 and a few fp64), timed (sequences at --size), sweep (a handful of
hand-picked values for the paper-like fp32 and fp16 sequences: no search), best (the
sweep's best per dtype again at --size with the odd check sizes, and at the odd size
--odd). Two variants also run under compute-sanitizer (memcheck, racecheck) at the
smallest size. A failure is recorded for its variant and the run goes on. Prints a table
last and writes JSON to $OUT (or ./results).

    python3 benchmarks/cuda_reference_check.py [--size 4096] [--odd 4093] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.appliers.reference.cuda_matmul import apply_transformation  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend, profile_for_gpu, visible_gpu  # noqa: E402
from peak_tune.catalog.loaders import load_devices, load_spec, load_transformations  # noqa: E402
from peak_tune.catalog.types import DeviceProfile  # noqa: E402
from peak_tune.core import KernelContext, Measurement, ProblemSize  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402
from peak_tune.expr import evaluate_bool  # noqa: E402

SIMT = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 16, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
        "WARP_X_DIM": 4, "OFFSET_AMOUNT": 4, "NUM_STAGES": 3, "SWIZZLE_GROUP": 8,
        "K_SPLITS": 2, "MIN_BLOCKS_PER_SM": 1}
MMA = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "TENSOR_TILE_M": 4,
       "TENSOR_TILE_N": 4, "OFFSET_AMOUNT": 8, "NUM_STAGES": 3, "SWIZZLE_GROUP": 8,
       "K_SPLITS": 2, "MIN_BLOCKS_PER_SM": 1}
SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 16, "TRD_Y_DIM": 2, "TRD_X_DIM": 4,
         "WARP_X_DIM": 8, "OFFSET_AMOUNT": 1, "NUM_STAGES": 2, "SWIZZLE_GROUP": 2,
         "K_SPLITS": 8, "MIN_BLOCKS_PER_SM": 2, "TENSOR_TILE_M": 1, "TENSOR_TILE_N": 2}
PAPER_FP32 = ("refactor", "tb-tiling", "thread-tiling", "thread-cache", "warp-tiling",
              "transpose", "offset", "vector-loads", "pipelining", "block-swizzle")
PAPER_FP16 = ("refactor", "tb-tiling", "tensor-core", "tensor-tiling", "offset",
              "vector-loads", "ldmatrix", "pipelining", "block-swizzle")
# (name, sequence, values, dtypes): timed at --size and --odd
TIMED: tuple[tuple[str, tuple[str, ...], Mapping[str, int], tuple[str, ...]], ...] = (
    ("naive seed", (), {}, ("float32", "float16")),
    ("refactor+tb-tiling 32x32", ("refactor", "tb-tiling"),
     {**SIMT, "BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 32}, ("float32",)),
    ("+thread-tiling+thread-cache", ("refactor", "tb-tiling", "thread-tiling", "thread-cache"),
     SIMT, ("float32",)),
    ("paper fp32 (10 steps)", PAPER_FP32, SIMT, ("float32", "float16")),
    ("fp32 chunk/staging", ("refactor", "tb-tiling", "thread-tiling", "thread-cache",
                            "thread-chunk", "transpose", "vector-loads", "register-staging",
                            "block-swizzle", "launch-bounds"), SIMT, ("float32",)),
    ("fp32 + split-k", PAPER_FP32 + ("split-k",), SIMT, ("float32",)),
    ("tensor-core 64x64", ("refactor", "tb-tiling", "tensor-core"),
     {**MMA, "BLOCK_M": 64, "BLOCK_N": 64}, ("float16",)),
    ("+tensor-tiling", ("refactor", "tb-tiling", "tensor-core", "tensor-tiling"), MMA,
     ("float16",)),
    ("paper fp16 (9 steps)", PAPER_FP16, MMA, ("float16",)),
    ("fp16 transpose + staging", ("refactor", "tb-tiling", "tensor-core", "tensor-tiling",
                                  "transpose", "offset", "vector-loads", "ldmatrix",
                                  "register-staging"), MMA, ("float16",)),
)
# validated at small and odd sizes only: every transformation after a short prefix
COVERAGE: tuple[tuple[str, ...], ...] = (
    ("refactor",), ("refactor", "tb-tiling"), ("refactor", "thread-tiling"),
    ("refactor", "thread-tiling", "thread-cache"), ("refactor", "thread-tiling", "thread-chunk"),
    ("refactor", "warp-tiling"), ("refactor", "thread-tiling", "thread-chunk", "warp-tiling"),
    ("refactor", "tb-tiling", "transpose"), ("refactor", "tb-tiling", "offset"),
    ("refactor", "tb-tiling", "register-staging"), ("refactor", "tb-tiling", "pipelining"),
    ("refactor", "split-k"), ("refactor", "tb-tiling", "split-k", "pipelining"),
    ("refactor", "block-swizzle", "split-k"), ("refactor", "tb-tiling", "vector-loads"),
    ("refactor", "tb-tiling", "vector-loads", "transpose", "pipelining"),
    ("refactor", "tb-tiling", "transpose", "vector-loads", "register-staging"),
    ("refactor", "launch-bounds"),
    ("refactor", "tb-tiling", "tensor-core"),
    ("refactor", "tb-tiling", "tensor-core", "tensor-tiling", "ldmatrix"),
    ("refactor", "tb-tiling", "transpose", "tensor-core", "ldmatrix", "pipelining"),
    ("refactor", "tb-tiling", "tensor-core", "vector-loads", "register-staging", "split-k"),
)
EXTRA_CHECKS = tuple(ProblemSize.of(dict(zip("MNK", s, strict=True)))
                     for s in ((1, 1, 1), (31, 17, 5), (130, 129, 2)))
FP64_COVERAGE = (("refactor", "thread-tiling", "thread-cache"),
                 ("refactor", "tb-tiling", "vector-loads", "transpose", "pipelining"),
                 ("refactor", "tb-tiling", "split-k", "pipelining"))
SANITIZE = ("paper fp16 (9 steps)", "fp32 + split-k")  # compute-sanitizer, smallest size
# (dtype, sequence, base values, overrides tried): hand-picked, not searched
SWEEP: tuple[tuple[str, tuple[str, ...], Mapping[str, int],
                   tuple[Mapping[str, int], ...]], ...] = (
    ("float32", PAPER_FP32, SIMT, (
        {}, {"TILE_K_SIZE": 8}, {"TILE_K_SIZE": 8, "NUM_STAGES": 4}, {"WARP_X_DIM": 8},
        {"WARP_X_DIM": 2}, {"BLOCK_N": 64, "TRD_X_DIM": 4},
        {"BLOCK_M": 64, "BLOCK_N": 64, "TRD_Y_DIM": 4, "TRD_X_DIM": 4},
        {"TRD_X_DIM": 4}, {"NUM_STAGES": 2})),
    ("float16", PAPER_FP16 + ("launch-bounds",), MMA, (
        {}, {"NUM_STAGES": 4}, {"BLOCK_N": 256, "TENSOR_TILE_N": 8},
        {"BLOCK_M": 256, "TENSOR_TILE_M": 8}, {"TENSOR_TILE_M": 2, "NUM_STAGES": 4},
        {"TILE_K_SIZE": 64}, {"BLOCK_M": 64, "TENSOR_TILE_M": 2, "NUM_STAGES": 4},
        {"TENSOR_TILE_N": 2, "NUM_STAGES": 4},
        {"BLOCK_N": 256, "TENSOR_TILE_N": 8, "NUM_STAGES": 4})),
)


def this_gpu_profile() -> DeviceProfile:
    name, arch = visible_gpu()
    found = profile_for_gpu(name, arch, load_devices([ROOT / "backends" / "devices"]).values())
    if found is None:
        raise SystemExit(f"no device profile for {name} ({arch})")
    return found


def build(sequence: tuple[str, ...], device: DeviceProfile) -> KernelContext:
    spec = load_spec(ROOT / "seeds" / "matmul")
    catalog = load_transformations([ROOT / "transforms"])
    context = seed_context(spec, "cuda")
    for tid in sequence:
        context = apply_transformation(context, catalog[tid], device)
    return context


def values(context: KernelContext, table: Mapping[str, int]) -> dict[str, int]:
    chosen = {p.name: table[p.name] for p in context.params}
    broken = [c for c in context.constraints if not evaluate_bool(c, chosen)]
    if broken:
        raise ValueError(f"values break {broken}")
    return chosen


def output_folder() -> Path:
    """Where a run writes its JSON: $OUT (the device tool's) or ./results."""
    folder = Path(os.environ.get("OUT", ROOT / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def time_vendors(backend: CudaBackend, dtype: str, sizes: Mapping[str, ProblemSize],
                 config: EvalConfig) -> dict[str, dict[str, Any]]:
    """cuBLAS at each labelled size, printed as it is timed."""
    spec = load_spec(ROOT / "seeds" / "matmul")
    found = {}
    for label, size in sizes.items():
        name, m = backend.time_vendor(spec, dtype, size, config)
        found[label] = {"name": name, **row(m)}
        print(f"cuBLAS {label}: {m.gflops:.0f} GFLOP/s ({name})", flush=True)
    return found


def row(m: Measurement) -> dict[str, Any]:
    return {"median_ms": m.median_ms, "gflops": m.gflops, "spread": m.spread,
            "samples_ms": list(m.samples_ms)}


class Runner:
    def __init__(self, backend: CudaBackend, config: EvalConfig, build_dir: Path) -> None:
        self.backend, self.config, self.build_dir = backend, config, build_dir
        self.spec = load_spec(ROOT / "seeds" / "matmul")

    def run(self, context: KernelContext, params: dict[str, int], dtype: str,
            size: ProblemSize, checks: tuple[ProblemSize, ...],
            sanitize: bool = False) -> dict[str, Any]:
        started = time.time()
        try:
            artifact = self.backend.compile(context, params, dtype, str(self.build_dir))
            request = EvalRequest(self.spec, context, params, dtype, size, checks, self.config)
            result: dict[str, Any] = {"status": "ok", **row(self.backend.evaluate(artifact,
                                                                                  request)),
                                      "resources": dict(artifact.resources)}
            if sanitize:
                result["sanitizer"] = self.backend.sanitize(artifact, request).splitlines()[:2]
        except Exception as exc:  # record and go on: one broken variant must not end the run
            result = {"status": type(exc).__name__, "message": str(exc)[:500],
                      "detail": str(getattr(exc, "detail", ""))[-1500:]}
        result["seconds"] = round(time.time() - started, 2)
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--odd", type=int, default=4093)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default="", help="timed variants whose name contains this")
    args = parser.parse_args()
    device = this_gpu_profile()
    spec = load_spec(ROOT / "seeds" / "matmul")
    checks = spec.check_sizes + EXTRA_CHECKS
    config = EvalConfig(timeout_s=60.0, warmup=2, repeats=args.repeats, max_timing_s=5.0)
    sizes = {"square": ProblemSize.of({"M": args.size, "N": args.size, "K": args.size}),
             "odd": ProblemSize.of({"M": args.odd, "N": args.odd, "K": args.odd})}
    out: dict[str, Any] = {**provenance(), "sizes": {k: v.as_dict() for k, v in sizes.items()},
                           "device_profile": device.name, "vendor": {}, "timed": [], "coverage": []}
    build_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-cuda-reference"
    folder = output_folder()

    def save() -> None:  # after every variant: a run stopped at its limit keeps its results
        (folder / "cuda_reference_check.json").write_text(json.dumps(out, indent=1))

    with CudaBackend(device) as backend:
        out["fingerprint"] = dict(backend.fingerprint())
        runner = Runner(backend, EvalConfig(timeout_s=20.0, warmup=1, repeats=3,
                                            max_timing_s=1.0), build_dir)
        small = ProblemSize.of({"M": 256, "N": 192, "K": 320})
        for sequence in COVERAGE:
            context = build(sequence, device)
            params = values(context, SMALL)
            dtypes = ("float16",) if "tensor-core" in sequence else ("float32", "float16")
            dtypes += ("float64",) if sequence in FP64_COVERAGE else ()
            for dtype in dtypes:
                result = runner.run(context, params, dtype, small, checks)
                out["coverage"].append({"sequence": list(sequence), "params": params,
                                        "dtype": dtype, "status": result["status"],
                                        "message": result.get("message", "")})
                print(f"coverage {'+'.join(sequence):70} {dtype:8} {result['status']} "
                      f"{result.get('message', '')[:200]}", flush=True)
                save()
        runner.config = config
        for dtype in ("float32", "float16"):
            for label, size in sizes.items():
                name, m = backend.time_vendor(spec, dtype, size, config)
                out["vendor"][f"{dtype}/{label}"] = {"name": name, **row(m)}

        def timed(name: str, sequence: tuple[str, ...], params: dict[str, int], dtype: str,
                  label: str, checks_here: tuple[ProblemSize, ...], section: str,
                  sanitize: bool = False) -> dict[str, Any]:
            context = build(sequence, device)
            result = runner.run(context, params, dtype, sizes[label], checks_here, sanitize)
            entry = {"section": section, "name": name, "sequence": list(sequence),
                     "params": params, "dtype": dtype, "size": label, **result}
            out["timed"].append(entry)
            print(f"{section:6} {name:34} {dtype:8} {label:6} {result['status']:12} "
                  f"{result.get('gflops', 0.0):9.0f} {result['seconds']:6.1f}s "
                  f"{result.get('message', '')[:200]}", flush=True)
            save()
            return entry

        for name, sequence, table, dtypes in TIMED:
            if args.only and args.only not in name:
                continue
            params = values(build(sequence, device), table)
            for dtype in dtypes:
                timed(name, sequence, params, dtype, "square", checks, "timed",
                      sanitize=name in SANITIZE)
        for dtype, sequence, base, overrides in SWEEP:
            tried = []
            for override in overrides:
                params = values(build(sequence, device), {**base, **override})
                label = ", ".join(f"{k}={v}" for k, v in override.items()) or "base values"
                tried.append(timed(label, sequence, params, dtype, "square", (), "sweep"))
            good = [t for t in tried if t["status"] == "ok"]
            if good:
                best = max(good, key=lambda t: t["gflops"])
                for label, checks_here in (("square", checks), ("odd", ())):
                    timed(f"best {dtype} sweep", sequence, best["params"], dtype, label,
                          checks_here, "best")
    save()
    print_table(out)
    return 0


def print_table(out: dict[str, Any]) -> None:
    fp = out["fingerprint"]
    print(f"\n{fp['device']}, driver {fp['driver']}, {fp['compiler']}; "
          f"sizes {out['sizes']['square']['M']} and {out['sizes']['odd']['M']} (square)")
    for key, vendor in out["vendor"].items():
        print(f"  cuBLAS {key}: {vendor['gflops']:.0f} GFLOP/s ({vendor['name']})")
    print(f"{'section':7} {'variant':44} {'dtype':8} {'size':6} {'GFLOP/s':>9} "
          f"{'x cuBLAS':>9}  status")
    for r in out["timed"]:
        vendor = out["vendor"][f"{r['dtype']}/{r['size']}"]["gflops"]
        gflops = r.get("gflops", 0.0)
        print(f"{r['section']:7} {r['name'][:44]:44} {r['dtype']:8} {r['size']:6} "
              f"{gflops:9.0f} {gflops / vendor:9.3f}  {r['status']} "
              f"{r.get('message', '')[:60]}")
    bad = [c for c in out["coverage"] if c["status"] != "ok"]
    print(f"coverage: {len(out['coverage']) - len(bad)}/{len(out['coverage'])} variants valid "
          "at odd sizes")
    for c in bad:
        print(f"  FAILED {'+'.join(c['sequence'])} {c['dtype']}: {c['status']} "
              f"{c['message'][:120]}")


if __name__ == "__main__":
    sys.exit(main())
