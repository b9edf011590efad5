"""fp32 SIMT kernels of the reference applier on this machine's GPU, side by side with cuBLAS.

The kernels the fp32 searches found best (register-staging; cp.async pipelining) and
their variants with double-buffer and interior-tiles (`--kernels`), at hand-picked tuning
points: built in
parallel on the host's cores, then validated (the spec's check sizes and the small odd
ones of cuda_reference_check) and timed at each --sizes through the CUDA backend; cuBLAS
SGEMM (TF32 off) is timed by the same worker. No search: this isolates what a kernel
change is worth. `--profile`: Nsight Compute's summary of each kernel's best point at the
first size. Prints a table last and writes JSON to $OUT (or ./results).

    python3 benchmarks/simt_check.py [--sizes 4096,8192] [--repeats 20] [--kernels ...]
                                     [--points JSON] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from cuda_reference_check import (  # benchmarks/ is the script's folder
    EXTRA_CHECKS,
    ROOT,
    Runner,
    build,
    output_folder,
    this_gpu_profile,
    time_vendors,
    values,
)
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_spec
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, ProblemSize

# search-8's best fp32 kernel (0.883x at 4096) and search-9's (cp.async, 0.805x)
STAGED = ("refactor", "thread-tiling", "tb-tiling", "register-staging", "vector-loads",
          "warp-tiling", "block-swizzle", "transpose", "launch-bounds")
PIPELINED = ("refactor", "launch-bounds", "tb-tiling", "vector-loads", "pipelining",
             "transpose", "thread-tiling", "thread-cache", "warp-tiling", "block-swizzle")
# the fp32 4096 search's best on an H200 (2026-11-30, search-20: 0.936x cuBLAS)
SEARCHED = ("refactor", "thread-tiling", "thread-cache", "tb-tiling", "offset", "interior-tiles",
            "register-staging", "double-buffer", "thread-chunk", "vector-loads", "transpose",
            "launch-bounds")
KERNELS: dict[str, tuple[str, ...]] = {
    "searched": SEARCHED,
    "staged": STAGED,
    "staged interior": (*STAGED, "interior-tiles"),
    "staged db": (*STAGED[:4], "double-buffer", *STAGED[4:]),
    "staged db interior": (*STAGED[:4], "double-buffer", *STAGED[4:], "interior-tiles"),
    "pipelined": PIPELINED,
    "pipelined interior": (*PIPELINED, "interior-tiles"),
}
BASE = {"BLOCK_M": 128, "BLOCK_N": 128, "TRD_Y_DIM": 8, "TRD_X_DIM": 8, "TILE_K_SIZE": 8,
        "WARP_X_DIM": 4, "SWIZZLE_GROUP": 2, "MIN_BLOCKS_PER_SM": 2, "NUM_STAGES": 3,
        "THREAD_CHUNK": 2, "OFFSET_AMOUNT": 4}
POINTS: tuple[Mapping[str, int], ...] = (  # overrides of BASE
    {},
    {"SWIZZLE_GROUP": 8},
    {"WARP_X_DIM": 2},
    {"MIN_BLOCKS_PER_SM": 1},
    {"TILE_K_SIZE": 16, "MIN_BLOCKS_PER_SM": 1},
    {"NUM_STAGES": 2},
)


def _build_one(job: tuple[tuple[str, ...], dict[str, int], DeviceProfile, str]) -> str:
    """In a child process: compile one variant into the shared build folder (the runner
    then finds it there); the error's first line if it does not build."""
    sequence, params, device, build_dir = job
    try:
        CudaBackend(device).compile(build(sequence, device), params, "float32", build_dir)
        return ""
    except Exception as exc:  # the runner reports it again, with its class
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help="the kernels to time, by name: " + ", ".join(KERNELS))
    parser.add_argument("--points", default="",
                        help="tuning points as a JSON list of overrides of BASE "
                             "(default: POINTS), e.g. '[{}, {\"THREAD_CHUNK\": 4}]'")
    parser.add_argument("--profile", action="store_true",
                        help="Nsight Compute on each kernel's best point")
    args = parser.parse_args()
    chosen = {k: v for k, v in KERNELS.items() if k in args.kernels.split(",")}
    device = this_gpu_profile()
    spec = load_spec(ROOT / "seeds" / "matmul")
    checks = spec.check_sizes + EXTRA_CHECKS
    config = EvalConfig(timeout_s=60.0, warmup=3, repeats=args.repeats, max_timing_s=5.0)
    sizes = {n: ProblemSize.of({"M": int(n), "N": int(n), "K": int(n)})
             for n in args.sizes.split(",")}
    out: dict[str, Any] = {**provenance(),
                           "device_profile": device.name, "checks": [c.as_dict() for c in checks],
                           "vendor": {}, "timed": []}
    folder = output_folder()
    build_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-simt"

    def save() -> None:
        (folder / "simt_check.json").write_text(json.dumps(out, indent=1))

    variants: list[tuple[str, str, KernelContext, dict[str, int]]] = []
    for kernel, sequence in chosen.items():
        context = build(sequence, device)
        for override in json.loads(args.points) if args.points else POINTS:
            try:
                params = values(context, {**BASE, **override})
            except ValueError as exc:
                print(f"skipped {kernel} {override}: {exc}", flush=True)
                continue
            name = f"{kernel} " + (", ".join(f"{k}={v}" for k, v in override.items())
                                   or "base")
            if all(v[3] != params or v[1] != kernel for v in variants):
                variants.append((name, kernel, context, params))
    started = time.time()
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        jobs = [(chosen[k], p, device, str(build_dir)) for _, k, _, p in variants]
        failed = sum(1 for error in pool.map(_build_one, jobs) if error)
    print(f"built {len(variants)} variants ({failed} failed) in {time.time() - started:.1f} s",
          flush=True)
    with CudaBackend(device) as backend:
        out["fingerprint"] = dict(backend.fingerprint())
        runner = Runner(backend, config, build_dir)
        out["vendor"] = time_vendors(backend, "float32", sizes, config)
        for name, kernel, context, params in variants:
            for label, size in sizes.items():
                # validated once, at the first size; the checks do not depend on the size
                here = checks if label == next(iter(sizes)) else ()
                result = runner.run(context, params, "float32", size, here)
                out["timed"].append({"name": name, "kernel": kernel, "params": params,
                                     "size": label, "sequence": list(context.applied),
                                     **result})
                print(f"timed {name:48} {label:5} {result['status']} "
                      f"{result.get('gflops', 0):8.0f} {result.get('resources', '')} "
                      f"{result.get('message', '')[:300]}", flush=True)
                save()
        if args.profile:
            first = next(iter(sizes))
            for kernel in chosen:
                good = [t for t in out["timed"] if t["kernel"] == kernel
                        and t["size"] == first and t["status"] == "ok"]
                if good:
                    best = max(good, key=lambda t: t["gflops"])
                    context = next(v[2] for v in variants if v[1] == kernel)
                    best["ncu"] = _profile(backend, context, best["params"], sizes[first],
                                           build_dir)
                    print(f"ncu {best['name']}: {best['ncu']}", flush=True)
                    save()
    print_table(out)
    save()
    return 0


def _profile(backend: CudaBackend, context: KernelContext, params: dict[str, int],
             size: ProblemSize, build_dir: Path) -> str:
    spec = load_spec(ROOT / "seeds" / "matmul")
    try:
        artifact = backend.compile(context, params, "float32", str(build_dir))
        request = EvalRequest(spec, context, params, "float32", size, (),
                              EvalConfig(timeout_s=120.0))
        return backend.profile(artifact, request).summary()
    except Exception as exc:  # the timings stand without it
        return f"not profiled: {exc}"


def print_table(out: dict[str, Any]) -> None:
    fp = out["fingerprint"]
    print(f"\n{fp['device']}, driver {fp['driver']}, {fp['compiler']}, {fp['flags']}")
    for label, vendor in out["vendor"].items():
        print(f"  cuBLAS {label}: {vendor['gflops']:.0f} GFLOP/s ({vendor['name']})")
    print(f"{'variant':50} {'size':5} {'GFLOP/s':>9} {'x cuBLAS':>9} {'regs':>5}  status")
    for r in sorted(out["timed"], key=lambda r: (r["size"], -r.get("gflops", 0.0))):
        gflops = r.get("gflops", 0.0)
        ratio = gflops / out["vendor"][r["size"]]["gflops"]
        regs = r.get("resources", {}).get("registers", 0)
        print(f"{r['name'][:50]:50} {r['size']:5} {gflops:9.0f} {ratio:9.3f} {regs:5}  "
              f"{r['status']} {r.get('message', '')[:80]}")


if __name__ == "__main__":
    sys.exit(main())
