"""Print a plan as an HLSL compute shader: `[numthreads(PT_THREADS_X, PT_THREADS_Y, 1)]
void main(...)` over the storage buffers A, B, C (bindings 0, 1, 2) and the sizes in push
constants, as the seed has them.

The program is the CUDA printer's (cuda_matmul/emit.py), said in HLSL's words:

| CUDA | HLSL |
| --- | --- |
| blockIdx, threadIdx | SV_GroupID, SV_GroupThreadID |
| blockDim, gridDim | the macros PT_THREADS_X / _Y, the sizes (there is no grid size) |
| __shared__ DTYPE pt_smem[...] | groupshared DTYPE pt_smem[...] (its size is fixed) |
| a pointer to a tile | an offset into pt_smem |
| __syncthreads() | GroupMemoryBarrierWithGroupSync() |
| a warp of 32 lanes | a wave (subgroup) of PT_WAVE_SIZE lanes, which the backend sets |
| __shfl_sync(mask, v, src) | WaveReadLaneAt(v, src) (wave-broadcast: wave.py) |
| #pragma unroll | [unroll] |
| static_assert | #if ... #error |
| uint4 loads | the buffer's float4 / half4 view at the same binding |

The thread group is the shader's numthreads, so the launch is the grid alone.
"""

from __future__ import annotations

from peak_tune.appliers.reference.cuda_matmul.emit import emit_edge_flag, emit_k_variants
from peak_tune.appliers.reference.cuda_matmul.emit_compute import (
    emit_accumulators,
    emit_compute_tile,
    outer_product,
    position_macros,
)
from peak_tune.appliers.reference.cuda_matmul.emit_copy import operands
from peak_tune.appliers.reference.cuda_matmul.geometry import derived_macros, macros_used
from peak_tune.appliers.reference.cuda_matmul.plan import Plan

from .coopmat_copy import emit_coopmat_copy_helpers, smem_unit
from .copy import copy_call, emit_copy_helpers, put_call
from .wave import emit_wave_compute_tile, emit_wave_lanes, wave_macros
from .writer import HlslWriter

__all__ = ["emit_shader", "launch_of"]

_BARRIER = "GroupMemoryBarrierWithGroupSync();"


def launch_of(plan: Plan) -> dict[str, str]:
    """KernelContext.launch: the groups over C (the thread group is numthreads)."""
    return {"grid_x": "ceil_div(N, BLOCK_N)", "grid_y": "ceil_div(M, BLOCK_M)"}


def emit_shader(plan: Plan, entry: str) -> str:
    writer = HlslWriter()
    _preamble(writer, plan)
    writer.line("[numthreads(PT_THREADS_X, PT_THREADS_Y, 1)]")
    with writer.block(f"void {entry}(uint3 group : SV_GroupID, uint3 thread : SV_GroupThreadID)"):
        writer.line("const int M = (int)sizes.M, N = (int)sizes.N, K = (int)sizes.K;")
        _block_position(writer, plan)
        writer.line("const int tid = (int)(thread.y * PT_THREADS_X + thread.x);")
        _thread_position(writer, plan)
        writer.line("const int k_lo = 0, k_hi = K;")
        if plan.workgroup_matrix:
            _workgroup_matrix(writer)
        else:
            _tiles(writer, plan)
    return writer.text()


def _tiles(writer: HlslWriter, plan: Plan) -> None:
    """Accumulators, K loop and epilogue of the threads' or subgroups' tiles."""
    if plan.coopmat:
        _coopmat_accumulators(writer)
    else:
        emit_accumulators(writer, plan)
    if plan.shared:
        _k_loops(writer, plan)
    else:
        _compute_direct(writer, plan)
    if plan.coopmat:
        _coopmat_epilogue(writer, plan)
    else:
        _epilogue(writer)


def _preamble(writer: HlslWriter, plan: Plan) -> None:
    writer.lines(
        "// C = A x B (row-major; A is M x K, B is K x N), block-tiled compute shader. DTYPE",
        "// (element) and ACC (accumulator) are set with -D by the backend, the tuning",
        "// parameters below with -D by the tuner.")
    for macro in macros_used(plan):
        writer.lines(f"#ifndef {macro}", f'#error "{macro} must be defined (-D{macro}=...)"',
                     "#endif")
    writer.lines(*derived_macros(plan), *position_macros(plan))
    if plan.coopmat:
        writer.raw("#if BLOCK_M % (16 * WAVES_M) != 0 || BLOCK_N % (16 * WAVES_N) != 0 || "
                   "PT_TK % 16 != 0\n"
                   '#error "16 x 16 cooperative-matrix tiles must cover the subgroup tiles"\n'
                   "#endif")
    else:
        writer.raw("#if BLOCK_M % PT_TRD_Y != 0 || BLOCK_N % PT_TRD_X != 0\n"
                   '#error "thread tiles must cover the block tile"\n'
                   "#endif")
    if plan.warp_tile:
        writer.raw("#ifndef PT_WAVE_SIZE\n"
                   '#error "PT_WAVE_SIZE (the subgroup size) is set by the HLSL backend"\n'
                   "#endif\n"
                   "#if WARP_X_DIM > PT_WAVE_SIZE || PT_THREADS_X % WARP_X_DIM != 0 || "
                   "PT_THREADS_Y % (PT_WAVE_SIZE / WARP_X_DIM) != 0\n"
                   '#error "waves must tile the thread grid"\n'
                   "#endif")
    if plan.wave_broadcast:
        writer.raw(wave_macros())
    writer.lines("", "struct Sizes { uint M; uint N; uint K; };",
                 "[[vk::push_constant]] ConstantBuffer<Sizes> sizes;",
                 "[[vk::binding(0)]] StructuredBuffer<DTYPE> A;",
                 "[[vk::binding(1)]] StructuredBuffer<DTYPE> B;",
                 "[[vk::binding(2)]] RWStructuredBuffer<DTYPE> C;")
    if plan.vector_a or plan.vector_b:
        writer.lines("// vector-loads: 4-element views of the same buffers",
                     "#define PT_PASTE(a, b) a##b", "#define PT_GLUE(a, b) PT_PASTE(a, b)",
                     "#define PT_DTYPE4 PT_GLUE(DTYPE, 4) /* float4 or half4 */")
        if plan.vector_a:
            writer.line("[[vk::binding(0)]] StructuredBuffer<PT_DTYPE4> A4;")
        if plan.vector_b:
            writer.line("[[vk::binding(1)]] StructuredBuffer<PT_DTYPE4> B4;")
    writer.line("")
    if plan.coopmat:
        _coopmat_types(writer, plan)
    if plan.workgroup_matrix:
        return  # no groupshared tiles: the driver stages the group's matrices
    if plan.shared and plan.coopmat:
        emit_coopmat_copy_helpers(writer, plan)
    elif plan.shared:
        emit_copy_helpers(writer, plan)


def _thread_position(writer: HlslWriter, plan: Plan) -> None:
    if plan.workgroup_matrix:
        return  # the group's matrices are the group's: no thread has a part of its own
    if plan.coopmat:
        writer.lines(
            "// cooperative-matrix: subgroup `wave` (one value for all its lanes) computes",
            "// the PT_SUB_M x PT_SUB_N tile at (wr, wc) of the block tile.",
            "const int wave = (int)WaveReadLaneFirst((uint)tid / PT_WAVE_SIZE);",
            "const int lane = tid - wave * PT_WAVE_SIZE;",
            "const int wr = wave / WAVES_N * PT_SUB_M, wc = wave % WAVES_N * PT_SUB_N;")
        return
    if not plan.warp_tile:
        writer.line("const int tx = tid % PT_THREADS_X, ty = tid / PT_THREADS_X;")
        return
    writer.lines(
        "// warp-tiling: a wave's PT_WAVE_SIZE lanes (consecutive invocations) cover a",
        "// (PT_WAVE_SIZE / WARP_X_DIM) x WARP_X_DIM patch of the thread grid; waves tile",
        "// the grid row by row.",
        "const int wave = tid / PT_WAVE_SIZE, lane = tid % PT_WAVE_SIZE;",
        "const int tx = wave % (PT_THREADS_X / WARP_X_DIM) * WARP_X_DIM + lane % WARP_X_DIM;",
        "const int ty = wave / (PT_THREADS_X / WARP_X_DIM) * (PT_WAVE_SIZE / WARP_X_DIM)"
        " + lane / WARP_X_DIM;")
    emit_wave_lanes(writer, plan)


def _block_position(writer: HlslWriter, plan: Plan) -> None:
    if plan.swizzle:
        writer.lines(
            "// block-swizzle: consecutive groups walk SWIZZLE_GROUP block rows column by",
            "// column, so the A rows and B columns they read stay in L2.",
            "const int groups_x = PT_CEIL_DIV(N, BLOCK_N), groups_y = PT_CEIL_DIV(M, BLOCK_M);",
            "const int pid = (int)group.y * groups_x + (int)group.x;",
            "const int span = SWIZZLE_GROUP * groups_x;",
            "const int first_m = pid / span * SWIZZLE_GROUP;",
            "const int rows = min(groups_y - first_m, SWIZZLE_GROUP);",
            "const int block_m = first_m + pid % span % rows, block_n = pid % span / rows;")
    else:
        writer.line("const int block_m = (int)group.y, block_n = (int)group.x;")
    writer.line("const int bm = block_m * BLOCK_M, bn = block_n * BLOCK_N; // the block tile")


def _compute_direct(writer: HlslWriter, plan: Plan) -> None:
    writer.lines("// Rows and columns clamped into the matrix: reads stay in bounds, and the",
                 "// epilogue skips the outputs that lie outside.",
                 "int a_row[PT_TRD_Y], b_col[PT_TRD_X];")
    with writer.unrolled("i", "PT_TRD_Y"):
        writer.line("a_row[i] = min(bm + PT_ROW(i), M - 1) * K;")
    with writer.unrolled("j", "PT_TRD_X"):
        writer.line("b_col[j] = min(bn + PT_COL(j), N - 1);")
    with writer.block("for (int k = k_lo; k < k_hi; ++k)"):
        writer.line("const int b_row = k * N;")
        outer_product(writer, plan, "A[a_row[i] + k]", "B[b_row + b_col[j]]")


def _epilogue(writer: HlslWriter) -> None:
    with writer.unrolled("i", "PT_TRD_Y"):
        writer.line("const int r = bm + PT_ROW(i);")
        with writer.unrolled("j", "PT_TRD_X"):
            writer.line("const int c = bn + PT_COL(j);")
            writer.line("if (r < M && c < N) C[r * N + c] = (DTYPE)acc[i][j];")


# ------------------------------------------------------------------ cooperative matrices


def _coopmat_types(writer: HlslWriter, plan: Plan) -> None:
    if plan.workgroup_matrix:
        writer.lines(
            "// workgroup-matrix: one matrix of the whole thread group (VK_NV_cooperative_",
            "// matrix2's workgroup scope, printed as Slang), fp32 accumulation; the driver",
            "// splits the work among the group's subgroups and stages the tiles, which",
            "// tensor layouts address (SPV_NV_tensor_addressing).",
            "using namespace linalg;",
            "typealias TileA = CoopMat<DTYPE, MemoryScope.Workgroup, BLOCK_M, PT_TK, "
            "CoopMatMatrixUse::MatrixA>;",
            "typealias TileB = CoopMat<DTYPE, MemoryScope.Workgroup, PT_TK, BLOCK_N, "
            "CoopMatMatrixUse::MatrixB>;",
            "typealias Sum = CoopMat<float, MemoryScope.Workgroup, BLOCK_M, BLOCK_N, "
            "CoopMatMatrixUse::MatrixAccumulator>;",
            "typealias Out = CoopMat<DTYPE, MemoryScope.Workgroup, BLOCK_M, BLOCK_N, "
            "CoopMatMatrixUse::MatrixAccumulator>;", "")
        return
    writer.lines(
        "// cooperative-matrix: Vulkan's subgroup matrices (Slang's linalg module, printed",
        "// as Slang: only Slang compiles them), 16 x 16 x 16 with fp32 accumulation.",
        "using namespace linalg;",
        "typealias TileA = CoopMat<DTYPE, MemoryScope.Subgroup, 16, 16, "
        "CoopMatMatrixUse::MatrixA>;",
        "typealias TileB = CoopMat<DTYPE, MemoryScope.Subgroup, 16, 16, "
        "CoopMatMatrixUse::MatrixB>;",
        "typealias Sum = CoopMat<float, MemoryScope.Subgroup, 16, 16, "
        "CoopMatMatrixUse::MatrixAccumulator>;",
        "typealias Out = CoopMat<DTYPE, MemoryScope.Subgroup, 16, 16, "
        "CoopMatMatrixUse::MatrixAccumulator>;")
    if not plan.direct_store:
        writer.line("groupshared DTYPE pt_out[WAVES_M * WAVES_N * 256]; // a 16 x 16 slot per "
                    "subgroup")
    writer.line("")


def _workgroup_matrix(writer: HlslWriter) -> None:
    """workgroup-matrix: the group's one accumulator, K in PT_TK steps, its A and B tiles
    loaded from the buffers and the result stored to C through tensor layouts (slices of
    each matrix) whose Constant clamp mode reads zeros and drops stores outside it."""
    writer.lines(
        "// Each matrix as a tensor layout (dimensions, row stride); a tile is a slice of",
        "// it. Outside the matrix, loads read 0 and stores are dropped: any size works.",
        "TensorLayout<2, CoopMatClampMode.Constant> a_layout, b_layout, c_layout;",
        "let a_matrix = a_layout.Dimension((uint)M, (uint)K).Stride((uint)K, 1).ClampValue(0);",
        "let b_matrix = b_layout.Dimension((uint)K, (uint)N).Stride((uint)N, 1).ClampValue(0);",
        "let c_matrix = c_layout.Dimension((uint)M, (uint)N).Stride((uint)N, 1);",
        "Sum acc = Sum(0.0);")
    with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK)"):
        writer.lines(
            "TileA a = TileA.Load(A, 0, a_matrix.Slice(bm, BLOCK_M, k0, PT_TK));",
            "TileB b = TileB.Load(B, 0, b_matrix.Slice(k0, PT_TK, bn, BLOCK_N));",
            "acc = coopMatMulAdd<float, false>(a, b, acc);")
    writer.line("Out(acc).Store(C, 0, c_matrix.Slice(bm, BLOCK_M, bn, BLOCK_N));")


def _coopmat_accumulators(writer: HlslWriter) -> None:
    writer.line("Sum acc[PT_CM_M][PT_CM_N];")
    with writer.unrolled("i", "PT_CM_M"), writer.unrolled("j", "PT_CM_N"):
        writer.line("acc[i][j] = Sum(0.0);")


def _coopmat_tile(writer: HlslWriter, a_tile: str, b_tile: str) -> None:
    """One groupshared K tile: PT_TK / 16 steps of the subgroup's tile products."""
    writer.line("[unroll]")
    with writer.block("for (int kk = 0; kk < PT_TK; kk += 16)"):
        writer.line("TileA a[PT_CM_M];")
        writer.line("TileB b[PT_CM_N];")
        # pt_smem4's uint4 hold 8 elements: offsets and strides in uint4
        a_at = smem_unit(f"{a_tile} + (wr + 16 * i) * PT_LDA + kk")
        b_at = smem_unit(f"{b_tile} + kk * PT_LDB + wc + 16 * j")
        with writer.unrolled("i", "PT_CM_M"):
            writer.line(f"a[i] = TileA.Load<CoopMatMatrixLayout::RowMajor>(pt_smem4, {a_at}, "
                        "PT_LDA / 8);")
        with writer.unrolled("j", "PT_CM_N"):
            writer.line(f"b[j] = TileB.Load<CoopMatMatrixLayout::RowMajor>(pt_smem4, {b_at}, "
                        "PT_LDB / 8);")
        with writer.unrolled("i", "PT_CM_M"), writer.unrolled("j", "PT_CM_N"):
            writer.line("acc[i][j] = coopMatMulAdd<float, false>(a[i], b[j], acc[i][j]);")


def _coopmat_epilogue(writer: HlslWriter, plan: Plan) -> None:
    """Each tile through the subgroup's groupshared slot to C, in bounds only; with
    direct-store, straight to C (whole block tiles only). The slot's store, even on a
    branch no block takes, held every such shader at 30-35 TFLOP/s fp16 4096 on an H100
    and an H200, where the direct stores alone ran 160-206
    (benchmarks/results/2026-12-05-h200-h100-vendor-timing-hlsl-coopmat-ablation.json)."""
    if plan.direct_store:
        writer.line("// direct-store: each tile straight to C (whole block tiles only)")
        with writer.unrolled("i", "PT_CM_M"), writer.unrolled("j", "PT_CM_N"):
            writer.line("Out(acc[i][j]).Store<CoopMatMatrixLayout::RowMajor>(C, "
                        "(bm + wr + 16 * i) * N + bn + wc + 16 * j, N);")
        return
    writer.lines("// Each tile through the subgroup's groupshared slot to C, in bounds only.",
                 "const int slot = wave * 256;")
    with writer.unrolled("i", "PT_CM_M"), writer.unrolled("j", "PT_CM_N"):
        writer.line("Out(acc[i][j]).Store<CoopMatMatrixLayout::RowMajor>(pt_out, slot, 16);")
        writer.line(_BARRIER)
        with writer.block("for (int e = lane; e < 256; e += PT_WAVE_SIZE)"):
            writer.line("const int r = bm + wr + 16 * i + e / 16, c = bn + wc + 16 * j + e % 16;")
            writer.line("if (r < M && c < N) C[r * N + c] = pt_out[slot + e];")
        writer.line(_BARRIER)


# ------------------------------------------------------------------ the K loop


def _k_loops(writer: HlslWriter, plan: Plan) -> None:
    """The K loop once per combination of the copies' run-time flags (as in CUDA)."""
    writer.line("#define PT_STAGE(s) ((s) * (PT_A_TILE + PT_B_TILE))")
    aligned = [f"{size} % PT_VEC == 0" for size, on in (("K", plan.vector_a),
                                                        ("N", plan.vector_b)) if on]
    if aligned:
        writer.line(f"const bool vec = {' && '.join(aligned)}; // rows of whole vectors")
    if plan.interior:
        emit_edge_flag(writer)
    emit_k_variants(writer, plan, lambda vec, edge: _k_loop(writer, plan, vec, edge))


def _k_loop(writer: HlslWriter, plan: Plan, vec: str, edge: str) -> None:
    a, b = operands(plan)
    if not plan.staging:
        writer.line("const int as = PT_STAGE(0), bs = as + PT_A_TILE;")
        with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK)"):
            writer.lines(copy_call(a, "copy", "as", "k0", vec, edge),
                         copy_call(b, "copy", "bs", "k0", vec, edge), _BARRIER)
            _compute_tile(writer, plan, "as", "bs")
            writer.line(_BARRIER)
        return
    if not plan.double_buffer:
        writer.line("const int as = PT_STAGE(0), bs = as + PT_A_TILE;")
    staged = "uint4" if plan.coopmat else "DTYPE"  # cooperative matrices: 16-byte pieces
    writer.line(f"{staged} ra[PT_A_REGS], rb[PT_B_REGS]; // register-staging: the next tile")
    with writer.block("if (k_lo < k_hi)"):
        writer.lines(copy_call(a, "fetch", "ra", "k_lo", vec, edge),
                     copy_call(b, "fetch", "rb", "k_lo", vec, edge))
        if plan.double_buffer:
            writer.lines(put_call(a, "PT_STAGE(0)", "ra", vec),
                         put_call(b, "PT_STAGE(0) + PT_A_TILE", "rb", vec))
    if plan.double_buffer:
        _loop_double_buffered(writer, plan, vec, edge)
        return
    with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK)"):
        writer.lines(put_call(a, "as", "ra", vec), put_call(b, "bs", "rb", vec), _BARRIER)
        with writer.block("if (k0 + PT_TK < k_hi)"):
            writer.lines(copy_call(a, "fetch", "ra", "k0 + PT_TK", vec, edge),
                         copy_call(b, "fetch", "rb", "k0 + PT_TK", vec, edge))
        _compute_tile(writer, plan, "as", "bs")
        writer.line(_BARRIER)


def _compute_tile(writer: HlslWriter, plan: Plan, a_tile: str, b_tile: str) -> None:
    if plan.coopmat:
        _coopmat_tile(writer, a_tile, b_tile)
    elif plan.wave_broadcast:
        emit_wave_compute_tile(writer, a_tile, b_tile)
    else:
        emit_compute_tile(writer, plan, a_tile, b_tile)


def _loop_double_buffered(writer: HlslWriter, plan: Plan, vec: str, edge: str) -> None:
    """double-buffer: tile t is computed from buffer t % 2 while tile t + 1, fetched into
    registers, is put into the other one, which nobody reads since the last barrier."""
    a, b = operands(plan)
    writer.lines(f"{_BARRIER} // tile 0 is in buffer 0", "int t = 0;")
    with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK, ++t)"):
        writer.lines("const int as = PT_STAGE(t & 1), bs = as + PT_A_TILE;",
                     "const bool more = k0 + PT_TK < k_hi;")
        with writer.block("if (more)"):
            writer.lines(copy_call(a, "fetch", "ra", "k0 + PT_TK", vec, edge),
                         copy_call(b, "fetch", "rb", "k0 + PT_TK", vec, edge))
        _compute_tile(writer, plan, "as", "bs")
        with writer.block("if (more)"):
            writer.lines(put_call(a, "PT_STAGE((t + 1) & 1)", "ra", vec),
                         put_call(b, "PT_STAGE((t + 1) & 1) + PT_A_TILE", "rb", vec))
        writer.line(f"{_BARRIER} // tile t + 1 is in place; buffer t % 2 is free")
