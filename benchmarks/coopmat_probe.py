"""How fast Vulkan's cooperative matrices can multiply on this GPU, with and without the
groupshared loads that feed them: the ceiling an fp16 HLSL matmul can reach.

Issue 17 asks for 0.5x cuBLAS HGEMM through `VK_KHR_cooperative_matrix`; the best
shaders so far run at 0.26x. Timings of whole matmuls cannot say whether the matrices
themselves (on Hopper the driver cannot reach wgmma), their operand loads or the copies
from the buffers hold them. Each probe shader keeps a subgroup's TILES_M x TILES_N
accumulators of 16 x 16 and multiplies for `iters` steps of K = 16 (a runtime value, so
nothing is folded):
- `mma`: the A and B fragments loaded once, only coopMatMulAdd in the loop;
- `mma + loads`: the fragments loaded from groupshared memory every step, as a staged
  matmul does (rows padded by 16 bytes, two K offsets in turn);
- `mma + loads + barrier`: and a group barrier every second step (one per K tile of 32),
  `... every step`: every step (one per K tile of 16);
- `mma + loads + stores + barrier every step`: and 4 uint4 a thread stored into
  groupshared memory every step, as the staged matmul stores its next tiles.
No memory traffic beyond that: the sums are stored once at the end. Then the staged hand
shader (tests/fixtures/hlsl/coopmat_fp16_staged.slang), a whole 4096 matmul, as written
and with its copies from the buffers taken apart: `fixed` reads the same first K tile at
every step (cache-resident: the buffers' traffic gone, the instructions kept), `no
loads` stores values made in registers (the groupshared stores and barriers kept); each
also with `B per column` (a B fragment loaded just before the MMAs that use it). With
the driver's register count of each pipeline. Printed in TFLOP/s beside cuBLAS HGEMM at
4096 timed in the same run (CuPy), with the fraction of it.

    bash benchmarks/device_vulkan.sh python3 benchmarks/coopmat_probe.py --out $OUT/probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.backends._hlsl_compile import compile_spirv, find_compiler  # noqa: E402
from peak_tune.backends._vulkan import VulkanDevice  # noqa: E402

PROBE = """
using namespace linalg;
#define THREADS (32 * WAVES)
#define LDA4 5                            /* uint4 per A row: K = 32 halves, padded */
#define LDB4 (TILES_N * 2 + 1)            /* uint4 per B row: 16 * TILES_N halves, padded */
#define B0 (16 * TILES_M * LDA4)
#define SH4 (B0 + 32 * LDB4)

typealias TileA = CoopMat<half, MemoryScope.Subgroup, 16, 16, CoopMatMatrixUse::MatrixA>;
typealias TileB = CoopMat<half, MemoryScope.Subgroup, 16, 16, CoopMatMatrixUse::MatrixB>;
typealias Sum = CoopMat<float, MemoryScope.Subgroup, 16, 16, CoopMatMatrixUse::MatrixAccumulator>;

struct Params { uint iters; };
[[vk::push_constant]] ConstantBuffer<Params> params;
[[vk::binding(0)]] RWStructuredBuffer<float> C;
groupshared uint4 sh[SH4];
groupshared uint4 stored[4 * THREADS];

[numthreads(THREADS, 1, 1)]
void main(uint3 group : SV_GroupID, uint3 thread : SV_GroupThreadID) {
    const uint tid = thread.x;
    for (uint i = tid; i < SH4; i += THREADS)  // halves near 1/1024: the sums stay finite
        sh[i] = uint4(0x14001400u + (i & 7u), 0x14001400u, 0x14011401u, 0x13ff13ffu);
    GroupMemoryBarrierWithGroupSync();
    const uint wave = WaveReadLaneFirst(tid / 32);
    Sum acc[TILES_M][TILES_N];
    [unroll] for (int i = 0; i < TILES_M; i++)
        [unroll] for (int j = 0; j < TILES_N; j++)
            acc[i][j] = Sum(0.0);
    TileA a[TILES_M];
    TileB b[TILES_N];
    [unroll] for (int i = 0; i < TILES_M; i++)
        a[i] = TileA.Load<CoopMatMatrixLayout::RowMajor>(sh, 16 * i * LDA4, LDA4);
    [unroll] for (int j = 0; j < TILES_N; j++)
        b[j] = TileB.Load<CoopMatMatrixLayout::RowMajor>(sh, B0 + 2 * j, LDB4);
    for (uint it = 0; it < params.iters; it++) {
#if LOADS
        const uint kk = it & 1u;  // K offset 0 or 16 of a groupshared K tile of 32
        [unroll] for (int i = 0; i < TILES_M; i++)
            a[i] = TileA.Load<CoopMatMatrixLayout::RowMajor>(sh, 16 * i * LDA4 + 2 * kk, LDA4);
        [unroll] for (int j = 0; j < TILES_N; j++)
            b[j] = TileB.Load<CoopMatMatrixLayout::RowMajor>(sh, B0 + 16 * kk * LDB4 + 2 * j,
                                                             LDB4);
#endif
        [unroll] for (int i = 0; i < TILES_M; i++)
            [unroll] for (int j = 0; j < TILES_N; j++)
                acc[i][j] = coopMatMulAdd<float, false>(a[i], b[j], acc[i][j]);
#if STORES  /* 4 uint4 a thread into groupshared memory, as a staged K step of 16 stores */
        [unroll] for (uint q = 0; q < 4; q++)
            stored[tid + q * THREADS] = uint4(it, tid, q, it ^ tid);
#endif
#if BARRIER == 1
        if ((it & 1u) == 1u)
            GroupMemoryBarrierWithGroupSync();
#elif BARRIER == 2
        GroupMemoryBarrierWithGroupSync();
#endif
    }
    const uint base = (group.x * WAVES + wave) * TILES_M * TILES_N * 256;
#if STORES  /* read back, so that the stores are not dropped */
    GroupMemoryBarrierWithGroupSync();
    C[base + 255 - (tid % 32)] = (float)stored[(tid * 5) % (4 * THREADS)].w;
#endif
    [unroll] for (int i = 0; i < TILES_M; i++)
        [unroll] for (int j = 0; j < TILES_N; j++)
            acc[i][j].Store<CoopMatMatrixLayout::RowMajor>(C, base + (i * TILES_N + j) * 256,
                                                           16);
}
"""
# (WAVES, TILES_M, TILES_N): the staged matmul's subgroup shapes and thread groups
SHAPES = ((4, 4, 4), (8, 4, 4), (4, 2, 4), (8, 2, 4), (4, 4, 2), (4, 2, 2), (8, 2, 2),
          (2, 4, 4))
KINDS = {"mma": {"LOADS": 0, "BARRIER": 0, "STORES": 0},
         "mma + loads": {"LOADS": 1, "BARRIER": 0, "STORES": 0},
         "mma + loads + barrier": {"LOADS": 1, "BARRIER": 1, "STORES": 0},
         "mma + loads + barrier every step": {"LOADS": 1, "BARRIER": 2, "STORES": 0},
         "mma + loads + stores + barrier every step": {"LOADS": 1, "BARRIER": 2, "STORES": 1}}
ITERS = 4096
REPEATS = 7
STAGED = (ROOT / "tests" / "fixtures" / "hlsl" / "coopmat_fp16_staged.slang").read_text()
_A_NEXT = "ra[i] = A4[(bm + r) * k8 + (k0 + BK) / 8 + c];"
_B_NEXT = "rb[i] = B4[(k0 + BK + r) * n8 + bn / 8 + c];"
# the staged shader's copies from the buffers, taken apart (see the module)
STAGED_ABLATIONS = {
    "as written": {},
    "fixed": {_A_NEXT: "ra[i] = A4[(bm + r) * k8 + c];",
              _B_NEXT: "rb[i] = B4[r * n8 + bn / 8 + c];"},
    "no loads": {_A_NEXT: "ra[i] = uint4(idx, k0, 0x3c003c00u, 0u);",
                 _B_NEXT: "rb[i] = uint4(k0, idx, 0x3c003c00u, 0u);"},
}
# each B fragment loaded just before the column of MMAs that uses it (fewer registers
# live: a third thread group per SM needs at most 170 at 128 threads)
_B_ALL = """            TileB b[TILES_N];
            [unroll] for (int i = 0; i < TILES_M; i++)
                a[i] = TileA.Load<CoopMatMatrixLayout::RowMajor>(
                    sh, as + (wr + 16 * i) * LDA4 + kk / 8, LDA4);
            [unroll] for (int j = 0; j < TILES_N; j++)
                b[j] = TileB.Load<CoopMatMatrixLayout::RowMajor>(
                    sh, bs + kk * LDB4 + (wc + 16 * j) / 8, LDB4);
            [unroll] for (int i = 0; i < TILES_M; i++)
                [unroll] for (int j = 0; j < TILES_N; j++)
                    acc[i][j] = coopMatMulAdd<float, false>(a[i], b[j], acc[i][j]);"""
_B_PER_COLUMN = """            [unroll] for (int i = 0; i < TILES_M; i++)
                a[i] = TileA.Load<CoopMatMatrixLayout::RowMajor>(
                    sh, as + (wr + 16 * i) * LDA4 + kk / 8, LDA4);
            [unroll] for (int j = 0; j < TILES_N; j++) {
                const TileB bj = TileB.Load<CoopMatMatrixLayout::RowMajor>(
                    sh, bs + kk * LDB4 + (wc + 16 * j) / 8, LDB4);
                [unroll] for (int i = 0; i < TILES_M; i++)
                    acc[i][j] = coopMatMulAdd<float, false>(a[i], bj, acc[i][j]);
            }"""
STAGED_ABLATIONS.update({f"{how}, B per column": {**edits, _B_ALL: _B_PER_COLUMN}
                         for how, edits in list(STAGED_ABLATIONS.items())})
# (WAVES_M, WAVES_N, TILES_M, TILES_N, BK) of the staged shader
STAGED_SHAPES = ((2, 2, 4, 4, 16), (2, 2, 4, 4, 32), (2, 4, 4, 2, 16), (2, 4, 4, 4, 16),
                 (2, 4, 4, 2, 32), (4, 2, 2, 4, 32), (4, 4, 2, 2, 32), (2, 4, 2, 4, 32))


def cublas_hgemm_tflops(n: int = 4096) -> float:
    """cuBLAS HGEMM (fp16 in and out, fp32 accumulation, through CuPy) at n, best of 20."""
    import cupy

    a = cupy.random.random((n, n), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.random((n, n), dtype=cupy.float32).astype(cupy.float16)
    for _ in range(5):
        cupy.matmul(a, b)
    times = []
    for _ in range(20):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.matmul(a, b)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return 2 * n**3 / min(times) / 1e9


def probe(device: VulkanDevice, folder: Path, waves: int, tiles_m: int, tiles_n: int,
          defines: dict[str, int], groups: int) -> dict[str, Any]:
    macros = {"WAVES": waves, "TILES_M": tiles_m, "TILES_N": tiles_n, **defines}
    spirv = folder / ("probe-" + "-".join(str(v) for v in macros.values()) + ".spv")
    compile_spirv(find_compiler("slang"), PROBE, macros, spirv, sixteen_bit=True)
    target = device.buffer(groups * waves * tiles_m * tiles_n * 256 * 4)
    pipeline = device.pipeline(spirv.read_bytes(), [target], 4)
    push = struct.pack("<I", ITERS)
    device.dispatch(pipeline, (groups, 1, 1), push)  # warm-up
    times = [device.dispatch(pipeline, (groups, 1, 1), push) for _ in range(REPEATS)]
    device.destroy(pipeline)
    device.free(target)
    flops = 2.0 * 16 * 16 * 16 * ITERS * tiles_m * tiles_n * waves * groups
    return {"ms": times, "tflops": flops / min(times) / 1e9, "median_tflops":
            flops / sorted(times)[len(times) // 2] / 1e9}


def staged(device: VulkanDevice, folder: Path, shape: tuple[int, ...], edits: dict[str, str],
           n: int = 4096) -> dict[str, Any]:
    """The staged shader (with `edits` to its text) on an n x n x n fp16 matmul."""
    import numpy as np

    waves_m, waves_n, tiles_m, tiles_n, bk = shape
    source = STAGED
    for old, new in edits.items():
        if old not in source:
            raise ValueError(f"the staged shader no longer has {old!r}")
        source = source.replace(old, new)
    macros = {"WAVE": 32, "WAVES_M": waves_m, "WAVES_N": waves_n, "TILES_M": tiles_m,
              "TILES_N": tiles_n, "BK": bk}
    spirv = folder / ("staged-" + "-".join(map(str, shape)) + f"-{len(edits)}.spv")
    compile_spirv(find_compiler("slang"), source, macros, spirv, sixteen_bit=True)
    rng = np.random.default_rng(1)
    buffers = [device.buffer(n * n * 2) for _ in range(3)]
    for buffer in buffers[:2]:
        device.write(buffer, rng.standard_normal(n * n).astype(np.float16))
    pipeline = device.pipeline(spirv.read_bytes(), buffers, 12)
    groups = (n // (16 * tiles_n * waves_n), n // (16 * tiles_m * waves_m), 1)
    push = struct.pack("<III", n, n, n)
    device.dispatch(pipeline, groups, push)
    times = [device.dispatch(pipeline, groups, push) for _ in range(REPEATS)]
    statistics = device.statistics(pipeline)
    device.destroy(pipeline)
    for buffer in buffers:
        device.free(buffer)
    return {"ms": times, "tflops": 2 * n**3 / min(times) / 1e9,
            "median_tflops": 2 * n**3 / sorted(times)[len(times) // 2] / 1e9,
            "driver_statistics": statistics}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=132 * 16,
                        help="thread groups a dispatch (default: 16 per H100/H200 SM)")
    parser.add_argument("--staged-only", action="store_true",
                        help="only the staged matmul rows (e.g. again without robust access: "
                             "PEAK_TUNE_VULKAN_UNBOUNDED=1)")
    parser.add_argument("--shapes", default="",
                        help="only these staged shapes, e.g. '2x4x4x2x32' (WAVES_M x WAVES_N x "
                             "TILES_M x TILES_N x BK), comma-separated")
    parser.add_argument("--ablations", default="",
                        help="only these staged rows, e.g. 'as written;no loads' (';' between)")
    parser.add_argument("--kinds", default="",
                        help="only the probes whose label is one of these (comma-separated)")
    parser.add_argument("--out", default="coopmat_probe.json")
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "coopmat_probe", **provenance(), "iters": ITERS,
                              "robust_access_off": os.environ.get("PEAK_TUNE_VULKAN_UNBOUNDED")
                              == "1",
                              "rows": []}
    with VulkanDevice(statistics=True) as device, tempfile.TemporaryDirectory() as folder:
        result["device"] = device.name
        result["driver"] = device.driver_version
        if not device.cooperative_matrix:
            print(f"{device.name} has no cooperative matrices")
            return 1
        try:
            result["cublas_hgemm_4096_tflops"] = vendor = cublas_hgemm_tflops()
        except Exception as exc:  # no CuPy: the probe's own figures still stand
            result["cublas_error"] = str(exc)[:300]
            vendor = 0.0
        print(f"cuBLAS HGEMM 4096: {vendor:.1f} TFLOP/s", flush=True)

        def record(label: str, measure: Callable[[], dict[str, Any]]) -> None:
            """One row: its figures (or its error: one shape's failure is a row), printed
            with the driver's register count where it has one, and the JSON rewritten."""
            try:
                row = {"probe": label, **measure()}
            except Exception as exc:
                result["rows"].append({"probe": label, "error": str(exc)[:1000]})
                print(f"{label}: failed: {str(exc).splitlines()[0]}", flush=True)
                return
            row["of_cublas"] = row["tflops"] / vendor if vendor else None
            result["rows"].append(row)
            registers = {k: v for k, v in row.get("driver_statistics", {}).items()
                         if "egister" in k}
            print(f"{label:60s} {row['tflops']:7.1f} TFLOP/s"
                  + (f"  {row['of_cublas']:.3f}x cuBLAS" if vendor else "")
                  + (f"  {registers}" if registers else ""), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))

        for waves, tiles_m, tiles_n in () if args.staged_only else SHAPES:
            for kind, defines in KINDS.items():
                if args.kinds and kind not in args.kinds.split(","):
                    continue
                record(f"{kind}, {waves} subgroups of {tiles_m}x{tiles_n}",
                       partial(probe, device, Path(folder), waves, tiles_m, tiles_n,
                               defines, args.groups))
        chosen = [s for s in STAGED_SHAPES
                  if not args.shapes or "x".join(map(str, s)) in args.shapes.split(",")]
        for shape in chosen:
            for how, edits in STAGED_ABLATIONS.items():
                if args.ablations and how not in args.ablations.split(";"):
                    continue
                record(f"staged matmul {how}, {shape[0]}x{shape[1]} subgroups of "
                       f"{shape[2]}x{shape[3]}, k {shape[4]}",
                       partial(staged, device, Path(folder), shape, edits))
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
