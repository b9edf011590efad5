"""Where stream-k's time goes on this machine's Hopper GPU: the kernel as emitted beside
the same kernel without stream-k, and two of its own variants made by editing its
source, each timed in rounds with cuBLAS in the same run (fp16 in and out, fp32
accumulation, 128 x 256 x 64 tiles, 4 stages, register-budget and tma-store).

- `whole runs`: PT_SK_MIN_RUN raised to the K tiles of a tile, so that every block's run
  is one whole output tile and no block hands sums over (the unit walk's own cost);
- `upwards`: SK_DOWNWARDS 0, each unit's K tiles walked upwards (as stream-k version 1
  did), so that the shared wave's blocks start at staggered K tiles (the L2 question).

With --ncu, Nsight Compute reads one launch of each at the first size: DRAM bytes, the
L2 hit rate and the duration, the evidence for or against the L2.

    python3 benchmarks/stream_k_probe.py [--sizes 4096,8192] [--rounds 2] [--ncu]

Writes stream_k_probe.json to $OUT (the device tool's) or benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from cuda_reference_check import (  # benchmarks/ is the script's folder
    Runner,
    build,
    output_folder,
    this_gpu_profile,
    time_vendors,
    values,
)
from provenance import provenance  # benchmarks/ is the script's folder
from wgmma_check import BASE, KERNELS, STREAM_K, STREAM_K_CHECKS

from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, ProblemSize

MIN_RUN = "#define PT_SK_MIN_RUN 8 "
# what ncu reports that tells the L2 story (names as ncu prints them)
NCU_WANTED = ("DRAM Throughput", "L2 Hit Rate", "Duration", "Memory Throughput",
              "L1/TEX Hit Rate", "Compute (SM) Throughput")


def edited(context: KernelContext, old: str, new: str) -> KernelContext:
    """The variant with one line of its source replaced (it must be there)."""
    if old not in context.source:
        raise SystemExit(f"stream-k's source no longer has {old.strip()!r}")
    return dataclasses.replace(context, source=context.source.replace(old, new))


def variants(device: DeviceProfile,
             ktiles: int) -> list[tuple[str, KernelContext, dict[str, int]]]:
    """(name, kernel, its overrides of BASE) of each variant timed."""
    stream_k = build(STREAM_K, device)
    return [("persistent", build(KERNELS["budget tma store persistent "], device), {}),
            ("stream-k", stream_k, {}),
            ("stream-k whole runs",
             edited(stream_k, MIN_RUN, f"#define PT_SK_MIN_RUN {ktiles} "), {}),
            ("stream-k upwards", stream_k, {"SK_DOWNWARDS": 0})]


def profiled(backend: CudaBackend, spec: KernelSpec, context: KernelContext,
             params: dict[str, int], size: ProblemSize, config: EvalConfig,
             build_dir: Path) -> dict[str, Any]:
    """ncu's figures for one launch of the variant at `size`, or why there are none (the
    timings already taken are kept either way)."""
    try:
        artifact = backend.compile(context, params, "float16", str(build_dir))
        report = backend.profile(artifact, EvalRequest(spec, context, params, "float16", size,
                                                       (), config))
    except Exception as exc:  # one variant's profile must not end the run
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"summary": report.summary(),
            "metrics": {k: v for k, v in report.metrics.items() if k in NCU_WANTED}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ncu", action="store_true", help="Nsight Compute at the first size")
    args = parser.parse_args()
    device = this_gpu_profile()
    config = EvalConfig(timeout_s=60.0, warmup=3, repeats=20, max_timing_s=5.0)
    build_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-stream-k"
    out: dict[str, Any] = {**provenance(), "point": BASE, "rows": [], "vendor": {}, "ncu": {}}
    path = output_folder() / "stream_k_probe.json"
    with CudaBackend(device) as backend:
        out["fingerprint"] = dict(backend.fingerprint())
        runner = Runner(backend, config, build_dir)
        for n in (int(s) for s in args.sizes.split(",")):
            size = ProblemSize.of({"M": n, "N": n, "K": n})
            out["vendor"][n] = time_vendors(backend, "float16", {"square": size},
                                            config)["square"]
            chosen = variants(device, n // BASE["TILE_K_SIZE"])
            for turn in range(args.rounds):
                for name, context, overrides in chosen:
                    # the stream-k variants are checked where tiles are shared, once
                    checks = STREAM_K_CHECKS if turn == 0 and name != "persistent" else ()
                    params = values(context, {**BASE, **overrides})
                    result = runner.run(context, params, "float16", size, checks)
                    result.pop("samples_ms", None)
                    out["rows"].append({"size": n, "variant": name, "round": turn, **result})
                    print(f"{n} round {turn} {name:22} {result['status']} "
                          f"{result.get('gflops', 0):8.0f} "
                          f"({result.get('gflops', 0) / out['vendor'][n]['gflops']:.3f}x cuBLAS)"
                          f" {result.get('message', '')[:200]}", flush=True)
                    path.write_text(json.dumps(out, indent=1))
            if args.ncu and not out["ncu"]:
                for name, context, overrides in chosen:
                    params = values(context, {**BASE, **overrides})
                    out["ncu"][name] = {"size": n, **profiled(backend, runner.spec, context,
                                                              params, size, config, build_dir)}
                    print(f"ncu {name:22} {out['ncu'][name]}", flush=True)
                    path.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
