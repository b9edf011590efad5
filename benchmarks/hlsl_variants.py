"""Fixed HLSL variants through Vulkan beside the same plans in CUDA and cuBLAS, one run.

Where does HLSL through Vulkan lose against CUDA on the same GPU? Each variant (a
sequence of the reference applier's steps and its tuning values) is printed as an HLSL
compute shader, built by each HLSL compiler asked for (glslang, DXC), validated and
timed through Vulkan with the HLSL backend's harness; the same sequence printed as a
CUDA kernel is timed by the CUDA backend, and cuBLAS by the CUDA backend's vendor, in
the same process. With PEAK_TUNE_VULKAN_UNBOUNDED=1 in the environment the Vulkan
device is made without robust buffer access (measurement only: see backends/_vulkan.py).
Writes JSON to --out and prints one line per row. Needs the Vulkan loader and NVIDIA's
ICD (../shared/PERF.md) and CuPy.

    python3 benchmarks/hlsl_variants.py --size 4096 --compilers glslang,dxc --out v.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peak_tune.appliers.reference import ReferenceApplier  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.backends.hlsl import HlslBackend  # noqa: E402
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations  # noqa: E402
from peak_tune.catalog.types import DeviceProfile  # noqa: E402
from peak_tune.core import KernelContext, KernelSpec, ProblemSize  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402

PAPER = ("refactor", "tb-tiling", "thread-tiling")
CUDA_WINNER = ("refactor", "thread-tiling", "tb-tiling", "vector-loads", "transpose",
               "thread-chunk", "register-staging", "double-buffer", "interior-tiles", "offset")
# (label, sequence, values): the paper's sequence, the HLSL search's best so far, and the
# CUDA searches' fp32 winners on the H200 (launch-bounds left out: HLSL has none)
VARIANTS: tuple[tuple[str, tuple[str, ...], dict[str, int]], ...] = (
    ("paper 128x128 k32", PAPER,
     {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "TRD_Y_DIM": 8, "TRD_X_DIM": 8}),
    ("hlsl best 128x128 k32 ch4", ("refactor", "thread-tiling", "thread-chunk", "tb-tiling"),
     {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
      "THREAD_CHUNK": 4}),
    ("cuda winner 64x128 k16", CUDA_WINNER,
     {"BLOCK_M": 64, "BLOCK_N": 128, "TILE_K_SIZE": 16, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
      "THREAD_CHUNK": 4, "OFFSET_AMOUNT": 4}),
    ("cuda winner 128x128 k8", CUDA_WINNER,
     {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 8, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
      "THREAD_CHUNK": 4, "OFFSET_AMOUNT": 4}),
    ("cuda winner 128x128 k16 ch2", CUDA_WINNER,
     {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 16, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
      "THREAD_CHUNK": 2, "OFFSET_AMOUNT": 4}),
    ("cuda winner + cache 128x128 k8 ch2", (*CUDA_WINNER, "thread-cache"),
     {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 8, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
      "THREAD_CHUNK": 2, "OFFSET_AMOUNT": 4}),
)


def through_vulkan(gpu: DeviceProfile, compiler: str, spirv_opt: str = "auto"
                   ) -> DeviceProfile:
    """The GPU as Vulkan shows it (its name, 1024 threads and 48 KiB of groupshared
    memory per group on NVIDIA), with one HLSL compiler, and spirv-opt after it or not."""
    return dataclasses.replace(gpu, facts={
        **gpu.facts, "vulkan_device": gpu.name.upper(), "max_threads_per_group": 1024,
        "groupshared_kib": 48, "hlsl_compiler": compiler, "spirv_opt": spirv_opt})


@functools.cache
def matmul() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


def built(backend: str, sequence: tuple[str, ...], gpu: DeviceProfile) -> KernelContext:
    catalog = load_transformations([ROOT / "transforms"])
    context = seed_context(matmul(), backend)
    for tid in sequence:
        context = ReferenceApplier().apply(context, catalog[tid], gpu)
    return context


def compiler_statistics(spirv_path: str) -> dict[str, float]:
    """The Vulkan driver compiler's statistics of the shader (registers, local memory, ...:
    VK_KHR_pipeline_executable_properties), from a pipeline made in this process."""
    from peak_tune.backends._vulkan import VulkanDevice

    with VulkanDevice(0, statistics=True) as device:
        buffers = [device.buffer(64) for _ in range(3)]
        pipeline = device.pipeline(Path(spirv_path).read_bytes(), buffers, 12)
        try:
            return device.statistics(pipeline)
        finally:
            device.destroy(pipeline)


def measure(backend: Any, context: KernelContext, values: dict[str, int], size: ProblemSize,
            build: str) -> dict[str, Any]:
    spec = matmul()
    params = {p.name: values[p.name] for p in context.params}
    started = time.perf_counter()
    try:
        artifact = backend.compile(context, params, "float32", build)
        got = backend.evaluate(artifact, EvalRequest(spec, context, params, "float32", size,
                                                     spec.check_sizes,
                                                     EvalConfig(timeout_s=300.0)))
    except Exception as exc:  # one variant's failure is a row
        return {"error": str(exc).splitlines()[0][:500]}
    row = {"gflops": got.gflops, "samples_ms": list(got.samples_ms),
           "resources": dict(artifact.resources),
           "seconds": round(time.perf_counter() - started, 2)}
    if artifact.path.endswith(".spv"):
        try:
            row["compiler_statistics"] = compiler_statistics(artifact.path)
        except Exception as exc:  # the statistics are a diagnosis: their lack is a note
            row["compiler_statistics"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--compilers", default="glslang,dxc")
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--out", default="hlsl_variants.json")
    args = parser.parse_args()
    gpu = load_device(ROOT / "backends" / "devices" / f"{args.device}.toml")
    size = ProblemSize.of({"M": args.size, "N": args.size, "K": args.size})
    build = tempfile.mkdtemp(prefix="peak-tune-hlsl-variants-")
    unbounded = os.environ.get("PEAK_TUNE_VULKAN_UNBOUNDED") == "1"
    result: dict[str, Any] = {"size": args.size, "dtype": "float32",
                              "robust_buffer_access": not unbounded, "rows": []}
    with CudaBackend(gpu) as cuda:
        name, vendor = cuda.time_vendor(matmul(), "float32", size,
                                        EvalConfig(timeout_s=300.0))
        result["vendor"] = {"name": name, "gflops": vendor.gflops}
        print(f"cuBLAS {vendor.gflops:.0f} GFLOP/s ({name})", flush=True)
        for compiler in args.compilers.split(","):
            with HlslBackend(through_vulkan(gpu, compiler)) as hlsl:
                result.setdefault("fingerprints", {})[compiler] = dict(hlsl.fingerprint())
                for label, sequence, values in VARIANTS:
                    row = measure(hlsl, built("hlsl", sequence, gpu), values, size, build)
                    result["rows"].append({"variant": label, "backend": f"hlsl-{compiler}",
                                           **row})
                    _show(label, f"hlsl-{compiler}", row, vendor.gflops)
        for label, sequence, values in ([] if args.no_cuda else VARIANTS):
            row = measure(cuda, built("cuda", sequence, gpu), values, size, build)
            result["rows"].append({"variant": label, "backend": "cuda", **row})
            _show(label, "cuda", row, vendor.gflops)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _show(label: str, backend: str, row: dict[str, Any], vendor: float) -> None:
    shown = (f"{row['gflops']:8.0f} GFLOP/s {row['gflops'] / vendor:.3f}x cuBLAS"
             if "gflops" in row else f"failed: {row['error'][:120]}")
    registers = {k: v for k, v in row.get("compiler_statistics", {}).items()
                 if any(w in str(k).lower() for w in ("register", "local", "spill", "error"))}
    registers.update({k: row["resources"][k] for k in ("registers", "local_bytes")
                      if k in row.get("resources", {})})
    shown += f"  {registers}" if registers else ""
    print(f"{label:36s} {backend:13s} {shown}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
