"""The HLSL backend on a GPU through Vulkan, beside cuBLAS in the same run.

Builds the naive seed shader and a 16x16 groupshared-tile shader with the HLSL backend
(glslang or DXC -> SPIR-V), validates and times them through Vulkan with the backend's
own harness at each size, and times cuBLAS (the CUDA backend's vendor) at the same
sizes in the same process, on the first NVIDIA GPU. With --dtype float16, also the
cooperative-matrix shader (tensor cores through VK_KHR_cooperative_matrix, built by
Slang) at several tile shapes per subgroup, and with NVIDIA's workgroup-scope matrices
(VK_NV_cooperative_matrix2) at several thread-group tiles. Writes JSON to --out and
prints one line per row. Needs the Vulkan loader and NVIDIA's ICD (../shared/PERF.md)
and CuPy; Slang's library for float16 (PEAK_TUNE_SLANG_LIBRARY).

    python3 benchmarks/hlsl_vulkan_check.py --device h200 --sizes 1024,4096
    python3 benchmarks/hlsl_vulkan_check.py --device h200 --sizes 4096 --dtype float16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.backends.hlsl import HlslBackend  # noqa: E402
from peak_tune.catalog.loaders import load_device, load_spec  # noqa: E402
from peak_tune.core import KernelContext, ProblemSize  # noqa: E402
from peak_tune.errors import InvalidPoint  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "hlsl"  # test fixtures too
TILED = (FIXTURES / "tiled.hlsl").read_text()
COOPMAT = (FIXTURES / "coopmat_fp16.slang").read_text()
LAUNCH = {"grid_x": "ceil_div(N, group_x)", "grid_y": "ceil_div(M, group_y)"}
# subgroups' tiles of 16 x 16: (TILES_M, TILES_N)
COOPMAT_TILES = ((1, 1), (2, 2), (4, 2), (2, 4), (4, 4))
COOPMAT_CHECKS = (ProblemSize.of({"M": 128, "N": 128, "K": 48}),)  # multiples of 64, 16
STAGED = (FIXTURES / "coopmat_fp16_staged.slang").read_text()
# the staged shader's thread groups: (WAVES_M, WAVES_N, TILES_M, TILES_N, BK)
STAGED_SHAPES = ((2, 2, 4, 4, 32), (2, 2, 2, 4, 32), (4, 2, 2, 4, 32), (2, 4, 4, 2, 32),
                 (2, 2, 4, 4, 16), (2, 2, 2, 2, 32), (4, 2, 2, 4, 16), (2, 4, 4, 2, 16),
                 (4, 4, 2, 2, 16), (4, 2, 4, 4, 16), (2, 4, 4, 4, 16), (4, 4, 2, 4, 16))
STAGED_CHECKS = (ProblemSize.of({"M": 256, "N": 256, "K": 96}),)  # multiples of 128, 32
WORKGROUP = (FIXTURES / "coopmat_fp16_workgroup.slang").read_text()
# the workgroup-scope shader's groups: (BM, BN, BK, THREADS), each by stride and through
# tensor layouts (TENSOR), one K step a loop iteration or UNROLL 4
WORKGROUP_SHAPES = ((128, 128, 32, 256), (128, 256, 32, 256), (256, 128, 32, 256),
                    (256, 256, 32, 256), (128, 128, 64, 128), (128, 256, 64, 256),
                    (256, 128, 64, 256), (128, 128, 32, 128), (64, 64, 32, 128),
                    (256, 256, 64, 512))
# (TENSOR, UNROLL): by stride, through tensor layouts (clamp mode Undefined, then
# Constant), unrolled
WORKGROUP_WAYS = ((0, 1), (1, 1), (2, 1), (1, 4))
WORKGROUP_CHECKS = (ProblemSize.of({"M": 512, "N": 512, "K": 256}),)  # multiples of 256
WHOLE_TILES = ProblemSize.of({"M": 512, "N": 512, "K": 256})  # whole tiles of every row


# The reference applier's cooperative-matrix step after the steps around it, at a few
# points: (sequence, BLOCK_M, BLOCK_N, TILE_K_SIZE, WAVES_M, WAVES_N); validated at the
# spec's odd check sizes too (the groupshared tiles zero what lies outside the matrix)
REFERENCE_COOPMAT = (
    (("refactor", "tb-tiling", "cooperative-matrix"), 64, 64, 32, 2, 2),
    (("refactor", "tb-tiling", "cooperative-matrix"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "cooperative-matrix"), 128, 256, 32, 2, 4),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "cooperative-matrix",
      "block-swizzle"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "cooperative-matrix",
      "block-swizzle"), 128, 256, 64, 2, 4),
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix"), 128, 128, 32, 4, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "cooperative-matrix"), 128, 128, 16, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "cooperative-matrix"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "cooperative-matrix"), 128, 128, 16, 4, 2),
    # with interior-tiles: constant 16-byte loads inside the matrices
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "interior-tiles", "cooperative-matrix"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "interior-tiles", "cooperative-matrix"), 128, 128, 16, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "interior-tiles", "cooperative-matrix"), 128, 256, 32, 2, 4),
    # with direct-store: the tiles straight to C (sizes of whole block tiles)
    (("refactor", "tb-tiling", "cooperative-matrix", "direct-store"), 128, 128, 32, 2, 2),
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix", "direct-store"), 128, 128, 32, 2, 2),
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix", "direct-store"), 128, 128, 16, 2, 2),
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix", "direct-store"), 128, 128, 32, 4, 2),
    (("refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
      "cooperative-matrix", "direct-store"), 128, 256, 32, 2, 4),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "interior-tiles", "cooperative-matrix", "direct-store"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "register-staging", "double-buffer", "vector-loads",
      "interior-tiles", "cooperative-matrix", "direct-store"), 128, 128, 16, 2, 2),
    # with workgroup-matrix: the group's one matrix, tiles from the buffers through
    # clamped tensor layouts (coopmat2; any size, so the odd check sizes too)
    (("refactor", "tb-tiling", "cooperative-matrix", "workgroup-matrix"), 128, 128, 32, 2, 2),
    (("refactor", "tb-tiling", "cooperative-matrix", "workgroup-matrix"), 128, 256, 32, 2, 4),
    (("refactor", "tb-tiling", "cooperative-matrix", "workgroup-matrix"), 256, 128, 32, 4, 2),
    (("refactor", "tb-tiling", "cooperative-matrix", "workgroup-matrix"), 256, 128, 64, 4, 2),
    (("refactor", "block-swizzle", "tb-tiling", "cooperative-matrix", "workgroup-matrix"),
     128, 256, 32, 2, 4),
    (("refactor", "block-swizzle", "tb-tiling", "cooperative-matrix", "workgroup-matrix"),
     128, 256, 64, 2, 4),
)


def _reference_coopmat(gpu: Any, checks: tuple[ProblemSize, ...]) -> list[tuple[Any, ...]]:
    from peak_tune.appliers.reference import ReferenceApplier
    from peak_tune.catalog.resolve import Catalog
    from peak_tune.evaluation.pipeline import seed_context
    from peak_tune.evaluation.validation import applicable_sizes

    catalog = Catalog.with_user_folders()
    # the h100 / h200 profiles do not offer workgroup-matrix (by stride it ran slowly
    # there): the check offers it, to time it through tensor layouts
    offered = dataclasses.replace(gpu, facts={**gpu.facts,
                                              "workgroup_matrix": "VK_NV_cooperative_matrix2"})
    rows = []
    for sequence, bm, bn, tk, wm, wn in REFERENCE_COOPMAT:
        label = f"reference {'>'.join(s[:8] for s in sequence[2:])} {bm}x{bn}x{tk} {wm}x{wn}"
        context = seed_context(catalog.spec("matmul"), "hlsl")
        device = offered if "workgroup-matrix" in sequence else gpu
        try:
            for tid in sequence:
                context = ReferenceApplier().apply(context, catalog.transformation(tid), device)
        except InvalidPoint as exc:  # a step this device cannot take
            print(f"{label}: not applied: {exc}", flush=True)
            continue
        values = {"BLOCK_M": bm, "BLOCK_N": bn, "TILE_K_SIZE": tk, "WAVES_M": wm,
                  "WAVES_N": wn, "SWIZZLE_GROUP": 8}
        params = {p.name: values[p.name] for p in context.params}
        # direct-store and workgroup-matrix serve whole tiles only: the check sizes that
        # break their size constraints are left out, as a study leaves them out
        rows.append((label, context.source, params, dict(context.launch),
                     applicable_sizes(context, params, (*checks, WHOLE_TILES))))
    return rows


# --ablate: the reference cooperative-matrix shader with one of its parts replaced by the
# staged hand shader's (each correct at sizes that are multiples of the tiles), to find
# what holds it back
EPILOGUE = "    // Each tile through the subgroup's groupshared slot to C, in bounds only."
DIRECT_STORE = """    [unroll]
    for (int i = 0; i < PT_CM_M; ++i) {
        [unroll]
        for (int j = 0; j < PT_CM_N; ++j) {
            Out(acc[i][j]).Store<CoopMatMatrixLayout::RowMajor>(
                C, (bm + wr + 16 * i) * N + bn + wc + 16 * j, N);
        }
    }
}
"""
ABLATIONS = {
    # (since 12-05 the reference stores blocks inside C directly: then nothing to replace)
    "direct store": lambda s: s if "RowMajor>(C, " in s else s[:s.index(EPILOGUE)]
    + DIRECT_STORE,
    "16-byte loads only": lambda s: s.replace("    if (full) return A8[off / 8];",
                                              "    return A8[off / 8];").replace(
        "    if (full) return B8[off / 8];", "    return B8[off / 8];"),
    "no half4 views": lambda s: "\n".join(line for line in s.splitlines()
                                          if "StructuredBuffer<PT_DTYPE4>" not in line),
    "vec branch only": lambda s: s.replace("const bool vec = K % PT_VEC == 0 && N % PT_VEC == 0;",
                                           "const bool vec = true;"),
}
# and on the shaders since (blocks inside C store straight to C, the others through the slot)
SLOT = "// Each tile through the subgroup's groupshared slot"


def _in_slot_path(edit: Any) -> Any:
    return lambda s: s if SLOT not in s else s[:s.index(SLOT)] + edit(s[s.index(SLOT):])


ABLATIONS.update({
    "direct path only": lambda s: s.replace(
        "if (bm + BLOCK_M <= M && bn + BLOCK_N <= N && N % 8 == 0)", "if (true)"),
    "slot path without barriers": _in_slot_path(
        lambda s: s.replace("GroupMemoryBarrierWithGroupSync();", "")),
    "slot in pt_smem4": _in_slot_path(lambda s: s.replace(
        "const int slot = wave * 256;", "const int slot = wave * 32;").replace(
        "(pt_out, slot, 16);", "(pt_smem4, slot, 2);").replace(
        "C[r * N + c] = pt_out[slot + e];",
        "{ const uint w = pt_smem4[slot + e / 8][(e % 8) / 2]; "
        "C[r * N + c] = (DTYPE)f16tof32(e % 2 != 0 ? w >> 16 : w & 0xFFFF); }")),
})


def _ablations(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each ablation, and all of them, on the reference shaders of the list."""
    found = []
    for label, source, params, launch, _checks in rows:
        for name, edit in [*ABLATIONS.items(), ("all", None)]:
            edited = source
            for each in ABLATIONS.values() if edit is None else (edit,):
                edited = each(edited)
            if edited != source:
                found.append((f"{label} [{name}]", edited, params, launch, STAGED_CHECKS))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--only", default="",
                        help="the shaders whose label holds one of these (comma-separated)")
    parser.add_argument("--ablate", action="store_true",
                        help="float16: also the reference shaders with parts of the staged one")
    parser.add_argument("--out", default="hlsl_vulkan_check.json")
    args = parser.parse_args()
    dtype = args.dtype
    spec = load_spec(ROOT / "seeds" / "matmul")
    gpu = load_device(ROOT / "backends" / "devices" / f"{args.device}.toml")
    # the same GPU seen through Vulkan ("NVIDIA H200"), with Vulkan's thread-group limits
    through_vulkan = dataclasses.replace(gpu, facts={
        **gpu.facts, "vulkan_device": args.device.upper(), "max_threads_per_group": 1024,
        "groupshared_kib": 48})
    config = EvalConfig(timeout_s=300.0)
    shaders = [("naive seed, 16x16 group", spec.sources["hlsl"], {}, LAUNCH,
                spec.check_sizes)]
    if dtype == "float32":  # the fixture's buffers are float: fp16 data is (rightly) wrong
        shaders.append(("16x16 groupshared tiles", TILED, {"TILE": 16}, LAUNCH,
                        spec.check_sizes))
    if dtype == "float16":
        shaders += [(f"cooperative matrices, {tm}x{tn} tiles of 16", COOPMAT,
                     {"WAVE": 32, "TILES_M": tm, "TILES_N": tn},
                     {"grid_x": f"ceil_div(N, {16 * tn})", "grid_y": f"ceil_div(M, {16 * tm})"},
                     COOPMAT_CHECKS) for tm, tn in COOPMAT_TILES]
        reference = _reference_coopmat(gpu, spec.check_sizes)
        shaders += reference
        if args.ablate:
            shaders += _ablations([row for row in reference if "128x128x32 2x2" in row[0]
                                   and ("interior" in row[0] or "vector" not in row[0])])
        shaders += [(f"staged cooperative matrices, {wm}x{wn} subgroups of {tm}x{tn}, "
                     f"k {bk}", STAGED,
                     {"WAVE": 32, "WAVES_M": wm, "WAVES_N": wn, "TILES_M": tm, "TILES_N": tn,
                      "BK": bk},
                     {"grid_x": f"ceil_div(N, {16 * tn * wn})",
                      "grid_y": f"ceil_div(M, {16 * tm * wm})"}, STAGED_CHECKS)
                    for wm, wn, tm, tn, bk in STAGED_SHAPES]
        shaders += [(f"workgroup cooperative matrices {bm}x{bn}x{bk}, {threads} threads"
                     + (", tensor layouts" if tensor else "")
                     + (" clamped" if tensor == 2 else "")
                     + (f", unroll {unroll}" if unroll > 1 else ""),
                     WORKGROUP, {"BM": bm, "BN": bn, "BK": bk, "THREADS": threads,
                                 "TENSOR": tensor, "UNROLL": unroll},
                     {"grid_x": f"ceil_div(N, {bn})", "grid_y": f"ceil_div(M, {bm})"},
                     WORKGROUP_CHECKS) for bm, bn, bk, threads in WORKGROUP_SHAPES
                    for tensor, unroll in WORKGROUP_WAYS]
    if args.only:
        shaders = [shader for shader in shaders
                   if any(part in shader[0] for part in args.only.split(","))]
    rows: list[dict[str, object]] = []
    result = {"benchmark": "hlsl_vulkan_check", "dtype": dtype,
              **provenance(), "device": {}, "rows": rows}
    build = tempfile.mkdtemp(prefix="peak-tune-hlsl-check-")
    with HlslBackend(through_vulkan) as hlsl, CudaBackend(gpu) as cuda:
        result["device"] = hlsl.fingerprint()
        for n in (int(s) for s in args.sizes.split(",")):
            size = ProblemSize.of({"M": n, "N": n, "K": n})
            name, vendor = cuda.time_vendor(spec, dtype, size, config)
            for label, source, params, launch, checks in shaders:
                context = KernelContext(kernel="matmul", backend="hlsl", source=source,
                                        entry="main", launch=dict(launch))
                started = time.perf_counter()
                try:
                    artifact = hlsl.compile(context, params, dtype, build)
                    measured = hlsl.evaluate(artifact, EvalRequest(
                        spec, context, params, dtype, size, checks, config))
                except Exception as exc:  # one shader's failure is a row, not the end
                    rows.append({"size": n, "shader": label, "error": str(exc)[:2000]})
                    print(f"{n:5d}  {label:26s} failed: {str(exc).splitlines()[0]}",
                          flush=True)
                    continue
                row = {"size": n, "shader": label, "gflops": measured.gflops,
                       "samples_ms": list(measured.samples_ms),
                       "evaluation_s": time.perf_counter() - started,
                       "vendor": name, "vendor_gflops": vendor.gflops,
                       "ratio": measured.gflops / vendor.gflops,
                       "of_peak": measured.gflops / gpu.peak_gflops[dtype]}
                rows.append(row)
                Path(args.out).write_text(json.dumps(result, indent=1))  # row by row
                print(f"{n:5d}  {label:40s} {measured.gflops:9.1f} GFLOP/s  cuBLAS "
                      f"{vendor.gflops:9.1f}  ratio {row['ratio']:.3f}  "
                      f"{100 * row['of_peak']:.1f}% of peak", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
