"""Print a plan as CUDA C++: `extern "C" __global__ void entry(A, B, C, M, N, K)`.

DTYPE and ACC come from the backend (-D), the tuning parameters from the tuner (-D); a
missing one is an #error. The kernel is: block position, thread position, K range,
accumulators, the K loop (operands from global memory, or shared tiles filled plainly,
through registers, or by cp.async into NUM_STAGES buffers), the epilogue. The wgmma kernel
(emit_wgmma) shares the preamble's snippets, the block position and the K range; the MFMA
kernel (emit_mfma) all of the skeleton, with its own position, accumulators, compute and
epilogue.
"""

from __future__ import annotations

from collections.abc import Callable

from .dialect import dialect_of
from .emit_compute import (
    emit_accumulators,
    emit_compute_direct,
    emit_compute_tile,
    emit_epilogue,
    emit_fragment_helpers,
    emit_position,
    emit_split_k_release,
    emit_split_k_wait,
    position_macros,
)
from .emit_copy import copy_call, emit_copy_helpers, operands, put_call
from .emit_mfma import (
    emit_mfma_accumulators,
    emit_mfma_compute_tile,
    emit_mfma_epilogue,
    emit_mfma_helpers,
    emit_mfma_position,
)
from .emit_wgmma import emit_wgmma_helpers, emit_wgmma_kernel
from .geometry import STATIC_SHARED_LIMIT, derived_macros, macros_used, smem_unit
from .plan import Plan
from .snippets import CP_ASYNC, LDMATRIX, MMA, SPLIT_K_TABLE
from .writer import CodeWriter

__all__ = ["emit_edge_flag", "emit_k_variants", "emit_source"]

_SIGNATURE = ("(const DTYPE *__restrict__ A, const DTYPE *__restrict__ B, DTYPE *__restrict__ C, "
              "int M, int N, int K)")
# tma: the backend's tensor maps of A and B (launch keys tma_A, tma_B), or null
_TMA_PARAMETERS = ", const void *__restrict__ tma_A, const void *__restrict__ tma_B)"
# tma-store: C's map too (launch key tma_C), or null
_TMA_STORE_PARAMETER = ", const void *__restrict__ tma_C)"


def emit_source(plan: Plan, entry: str) -> str:
    writer = CodeWriter()
    _preamble(writer, plan)
    bounds = "__launch_bounds__(PT_THREADS_BOUND, MIN_BLOCKS_PER_SM) " if plan.launch_bounds else ""
    if plan.wgmma:  # its own body (emit_wgmma); registers bounded for every warpgroup
        signature = _SIGNATURE[:-1] + _TMA_PARAMETERS if plan.tma else _SIGNATURE
        if plan.tma_store:
            signature = signature[:-1] + _TMA_STORE_PARAMETER
        cluster = "__cluster_dims__(CLUSTER_M, 1, 1) " if plan.cluster else ""
        with writer.block(f'extern "C" __global__ void {cluster}'
                          f'{bounds or "__launch_bounds__(PT_THREADS) "}{entry}{signature}'):
            if plan.cluster:
                writer.line("const int pt_rank = (int)pt_cluster_rank(); "
                            "// cluster-multicast: this block's place in its cluster")
            if not plan.persistent:  # persistent: per output tile, inside its loop
                _block_position(writer, plan)
            _k_range(writer, plan)
            emit_wgmma_kernel(writer, plan, lambda: _block_position(writer, plan, "tile"))
        return writer.text()
    if plan.mfma and not bounds:  # registers for PT_THREADS, not for 1024 threads
        bounds = "__launch_bounds__(PT_THREADS) "
    with writer.block(f'extern "C" __global__ void {bounds}{entry}{_SIGNATURE}'):
        _block_position(writer, plan)
        (emit_mfma_position if plan.mfma else emit_position)(writer, plan)
        _k_range(writer, plan)
        (emit_mfma_accumulators if plan.mfma else emit_accumulators)(writer, plan)
        if not plan.shared:
            emit_compute_direct(writer, plan)
        else:
            _shared_memory(writer, plan)
            _k_loops(writer, plan)
        if plan.split_k:
            emit_split_k_wait(writer, plan)
        (emit_mfma_epilogue if plan.mfma else emit_epilogue)(writer, plan)
        if plan.split_k:
            emit_split_k_release(writer, plan)
    return writer.text()


def _compute_tile(writer: CodeWriter, plan: Plan, a_tile: str, b_tile: str) -> None:
    (emit_mfma_compute_tile if plan.mfma else emit_compute_tile)(writer, plan, a_tile, b_tile)


def _preamble(writer: CodeWriter, plan: Plan) -> None:
    writer.lines(
        "// C = A x B (row-major; A is M x K, B is K x N), block-tiled. DTYPE (element) and",
        "// ACC (accumulator) are set with -D by the backend, the tuning parameters below",
        "// with -D by the tuner.",
    )
    writer.raw(dialect_of(plan).preamble)
    writer.line("")
    for macro in macros_used(plan):
        writer.lines(f"#ifndef {macro}", f'#error "{macro} must be defined (-D{macro}=...)"',
                     "#endif")
    writer.lines(*derived_macros(plan), *position_macros(plan))
    if plan.launch_bounds:
        writer.line("#define PT_THREADS_BOUND (PT_THREADS < 1024 ? PT_THREADS : 1024) "
                    "/* too many: pruned at launch */")
    _static_checks(writer, plan)
    writer.line("")
    if plan.split_k:
        writer.raw(SPLIT_K_TABLE)
        writer.lines("__device__ __forceinline__ void pt_store(DTYPE *C, size_t off, ACC v, "
                     "bool first) {",
                     "    // split-k: the first slice stores, later ones add (read past L1)",
                     "    C[off] = first ? (DTYPE)v : (DTYPE)((ACC)"
                     f"{dialect_of(plan).load_l2}(C + off) + v);",
                     "}", "")
    if plan.stages:
        writer.raw(CP_ASYNC)
        writer.line("")
    if plan.mma:
        writer.raw(MMA)
        if plan.ldmatrix:
            writer.raw(LDMATRIX)
        writer.line("")
    if plan.wgmma:
        emit_wgmma_helpers(writer, plan)
        return
    if plan.shared:
        emit_copy_helpers(writer, plan)
    if plan.mma:
        emit_fragment_helpers(writer, plan)
    if plan.mfma:
        emit_mfma_helpers(writer, plan)


def _static_checks(writer: CodeWriter, plan: Plan) -> None:
    if plan.wgmma or plan.mfma:
        return  # emit_wgmma_helpers / emit_mfma_helpers check their tiles
    if plan.mma:
        writer.lines(
            'static_assert(BLOCK_M % PT_WARP_M == 0 && BLOCK_N % PT_WARP_N == 0, '
            '"warp tiles must cover the block tile");',
            'static_assert(PT_TK % 16 == 0, "MMA steps are 16 deep: TILE_K_SIZE % 16 == 0");')
        return
    writer.line('static_assert(BLOCK_M % PT_TRD_Y == 0 && BLOCK_N % PT_TRD_X == 0, '
                '"thread tiles must cover the block tile");')
    if plan.warp_tile:
        writer.line('static_assert(PT_THREADS_X % WARP_X_DIM == 0 && '
                    f'PT_THREADS_Y % ({dialect_of(plan).warp} / WARP_X_DIM) == 0, '
                    '"warps must tile the thread grid");')


def _block_position(writer: CodeWriter, plan: Plan, tile: str = "") -> None:
    """bm, bn: where the block's tile of C lies; of output tile number `tile` (of
    tiles_m x tiles_n, row by row) in a persistent kernel, else of this block. With
    cluster-multicast the tile or block numbers count clusters, each CLUSTER_M block rows
    of one column, and the block's rank in its cluster picks its row."""
    row = "cluster_m" if plan.cluster else "block_m"
    if tile and plan.swizzle:
        _swizzled(writer, "tiles", tile, "tiles_n", "cluster_rows" if plan.cluster
                  else "tiles_m", row)
    elif tile:
        writer.line(f"const int {row} = {tile} / tiles_n, block_n = {tile} % tiles_n;")
    elif plan.swizzle:
        clusters = "(gridDim.x / CLUSTER_M)" if plan.cluster else "gridDim.x"
        across = f"(int){clusters}" if plan.cluster else clusters
        x = "blockIdx.x / CLUSTER_M" if plan.cluster else "blockIdx.x"
        _swizzled(writer, "clusters" if plan.cluster else "blocks", "pid", across,
                  "(int)gridDim.y", row, f"const int pid = blockIdx.y * {clusters} + {x};")
    elif plan.cluster:
        writer.line("const int cluster_m = blockIdx.y, block_n = blockIdx.x / CLUSTER_M;")
    else:
        writer.line("const int block_m = blockIdx.y, block_n = blockIdx.x;")
    if plan.cluster:
        writer.line("const int block_m = cluster_m * CLUSTER_M + pt_rank; "
                    "// past tiles_m: zeros in, nothing stored")
    writer.line("const int bm = block_m * BLOCK_M, bn = block_n * BLOCK_N; // the block tile")


def _swizzled(writer: CodeWriter, walkers: str, number: str, across: str, down: str,
              row: str, *numbering: str) -> None:
    """block-swizzle: `row`, block_n of tile `number` (of `down` x `across`) in groups of
    SWIZZLE_GROUP rows walked column by column; `numbering` lines define `number`."""
    writer.lines(
        f"// block-swizzle: consecutive {walkers} walk SWIZZLE_GROUP block rows column by",
        "// column, so the A rows and B columns they read stay in L2.",
        *numbering,
        f"const int group = SWIZZLE_GROUP * {across};",
        f"const int first_m = {number} / group * SWIZZLE_GROUP;",
        f"const int rows = min({down} - first_m, SWIZZLE_GROUP);",
        f"const int {row} = first_m + {number} % group % rows, "
        f"block_n = {number} % group / rows;")


def _k_range(writer: CodeWriter, plan: Plan) -> None:
    if plan.split_k:
        writer.lines(
            "// split-k: slice blockIdx.z of K, whole PT_KSTEP steps long (may be empty)",
            "const int chunk = PT_CEIL_DIV(PT_CEIL_DIV(K, K_SPLITS), PT_KSTEP) * PT_KSTEP;",
            "const int k_lo = min(K, (int)blockIdx.z * chunk), k_hi = min(K, k_lo + chunk);")
    else:
        writer.line("const int k_lo = 0, k_hi = K;")


# CUDA: a launch with less dynamic shared memory than the tiles need stops at once. HIP
# has no portable register for the size: there the launch's own check must do.
_DYNAMIC_SIZE_CHECK = (
    "    unsigned pt_dynamic;\n"
    '    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(pt_dynamic));\n'
    "    if (pt_dynamic < PT_SMEM_ELEMS * sizeof(DTYPE)) __trap(); // launched too small\n")


def _shared_memory(writer: CodeWriter, plan: Plan) -> None:
    unit = smem_unit(plan)
    writer.raw(
        f"#if PT_SMEM_EST_BYTES > {STATIC_SHARED_LIMIT}\n"
        "    extern __shared__ __align__(16) unsigned char pt_smem_raw[];\n"
        "    DTYPE *const pt_smem = reinterpret_cast<DTYPE *>(pt_smem_raw);\n"
        f"    static_assert(sizeof(DTYPE) <= {unit}, \"the launch sizes dynamic shared memory "
        f"for {unit}-byte elements\");\n"
        f"{_DYNAMIC_SIZE_CHECK if not plan.hip else ''}"
        "#else\n"
        "    __shared__ __align__(16) DTYPE pt_smem[PT_SMEM_ELEMS];\n"
        f"    static_assert(PT_SMEM_ELEMS * sizeof(DTYPE) <= {STATIC_SHARED_LIMIT}, "
        '"the tiles exceed the static shared memory for this element type");\n'
        "#endif")
    writer.line("#define PT_STAGE(s) (pt_smem + (s) * (PT_A_TILE + PT_B_TILE))")
    aligned = []
    if plan.vector_a:
        aligned.append("K % PT_VEC == 0 && (unsigned long long)A % 16 == 0")
    if plan.vector_b:
        aligned.append("N % PT_VEC == 0 && (unsigned long long)B % 16 == 0")
    if aligned:
        writer.line(f"const bool vec = {' && '.join(aligned)}; // 16-byte aligned rows")


def _k_loops(writer: CodeWriter, plan: Plan) -> None:
    """The K loop once per combination of the copies' run-time flags, each with literal
    flag values: a loop keeps only the addressing and checks of its own copies."""
    if plan.interior:
        emit_edge_flag(writer)
    if plan.vector_a or plan.vector_b:  # (the comment of the variants before interior-tiles)
        writer.lines("// vector-loads: the K loop twice, with and without 16-byte copies, so",
                     "// that each copy keeps only the addressing it uses")
    emit_k_variants(writer, plan, lambda vec, edge: _k_loop(writer, plan, vec, edge))


def emit_edge_flag(writer: CodeWriter) -> None:
    """interior-tiles' `edge`: whether the block's copies must check the bounds."""
    writer.lines("// interior-tiles: a block tile wholly inside C whose K range is whole "
                 "K tiles", "// copies its tiles with no bounds checks",
                 "const bool edge = bm + BLOCK_M > M || bn + BLOCK_N > N || "
                 "(k_hi - k_lo) % PT_TK != 0;")


def emit_k_variants(writer: CodeWriter, plan: Plan, k_loop: Callable[[str, str], None]
                    ) -> None:
    """`k_loop(vec, edge)` once per combination of the copies' flags (literal "true" /
    "false"; vec "" when no copy is vectorised), under `if / else if / else` on them."""
    vector = plan.vector_a or plan.vector_b
    # (condition, vec, edge): the first whose condition holds runs; "" is the last, else
    loops = [("vec", "true", "true"), ("", "false", "true")] if vector else [("", "", "true")]
    if plan.interior:
        loops.insert(0, ("vec && !edge" if vector else "!edge", loops[0][1], "false"))
    if len(loops) == 1:
        k_loop("", "true")
        return
    for index, (condition, vec, edge) in enumerate(loops):
        head = f"{'else if' if index else 'if'} ({condition})" if condition else "else"
        with writer.block(head):
            k_loop(vec, edge)


def _k_loop(writer: CodeWriter, plan: Plan, vec: str, edge: str) -> None:
    if plan.staging:
        _loop_staged(writer, plan, vec, edge)
    elif plan.stages:
        _loop_stages(writer, plan, vec, edge)
    else:
        _loop_single(writer, plan, vec, edge)


def _copies(writer: CodeWriter, plan: Plan, function: str, target: str, k0: str,
            vec: str, edge: str) -> None:
    a, b = operands(plan)
    writer.line(copy_call(a, function, target, k0, vec, edge))
    writer.line(copy_call(b, function, f"{target} + PT_A_TILE", k0, vec, edge))


def _loop_single(writer: CodeWriter, plan: Plan, vec: str, edge: str) -> None:
    writer.line("DTYPE *const as = PT_STAGE(0), *const bs = as + PT_A_TILE;")
    with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK)"):
        _copies(writer, plan, "copy", "as", "k0", vec, edge)
        writer.line("__syncthreads();")
        _compute_tile(writer, plan, "as", "bs")
        writer.line("__syncthreads();")


def _loop_staged(writer: CodeWriter, plan: Plan, vec: str, edge: str) -> None:
    if not plan.double_buffer:  # (double-buffer names the tiles per K tile)
        writer.line("DTYPE *const as = PT_STAGE(0), *const bs = as + PT_A_TILE;")
    writer.line("DTYPE ra[PT_A_REGS], rb[PT_B_REGS]; // register-staging: the next tile")
    a, b = operands(plan)
    with writer.block("if (k_lo < k_hi)"):
        writer.lines(copy_call(a, "fetch", "ra", "k_lo", vec, edge),
                     copy_call(b, "fetch", "rb", "k_lo", vec, edge))
        if plan.double_buffer:  # the first tile straight into buffer 0
            writer.lines(put_call(a, "PT_STAGE(0)", "ra", vec),
                         put_call(b, "PT_STAGE(0) + PT_A_TILE", "rb", vec))
    if plan.double_buffer:
        _loop_double_buffered(writer, plan, vec, edge)
        return
    with writer.block("for (int k0 = k_lo; k0 < k_hi; k0 += PT_TK)"):
        writer.lines(put_call(a, "as", "ra", vec), put_call(b, "bs", "rb", vec),
                     "__syncthreads();")
        with writer.block("if (k0 + PT_TK < k_hi)"):
            writer.lines(copy_call(a, "fetch", "ra", "k0 + PT_TK", vec, edge),
                         copy_call(b, "fetch", "rb", "k0 + PT_TK", vec, edge))
        _compute_tile(writer, plan, "as", "bs")
        writer.line("__syncthreads();")


def _loop_double_buffered(writer: CodeWriter, plan: Plan, vec: str, edge: str) -> None:
    """double-buffer: tile t is computed from buffer t % 2 while tile t + 1, fetched into
    registers, is put into the other one, which nobody reads since the last barrier."""
    a, b = operands(plan)
    # t lives in the loop: the MMA epilogue declares a t (a fragment column) of its own
    writer.line("__syncthreads(); // tile 0 is in buffer 0")
    with writer.block("for (int k0 = k_lo, t = 0; k0 < k_hi; k0 += PT_TK, ++t)"):
        writer.lines("DTYPE *const as = PT_STAGE(t & 1), *const bs = as + PT_A_TILE;",
                     "const bool more = k0 + PT_TK < k_hi;")
        with writer.block("if (more)"):
            writer.lines(copy_call(a, "fetch", "ra", "k0 + PT_TK", vec, edge),
                         copy_call(b, "fetch", "rb", "k0 + PT_TK", vec, edge))
        _compute_tile(writer, plan, "as", "bs")
        with writer.block("if (more)"):
            writer.lines(put_call(a, "PT_STAGE((t + 1) & 1)", "ra", vec),
                         put_call(b, "PT_STAGE((t + 1) & 1) + PT_A_TILE", "rb", vec))
        writer.line("__syncthreads(); // tile t + 1 is in place; buffer t % 2 is free")


def _loop_stages(writer: CodeWriter, plan: Plan, vec: str, edge: str) -> None:
    writer.line("const int tiles = k_hi > k_lo ? PT_CEIL_DIV(k_hi - k_lo, PT_TK) : 0;")
    writer.line("// pipelining: NUM_STAGES - 1 tiles in flight before the first is used")
    with writer.unrolled("s", "PT_STAGES - 1"):
        with writer.block("if (s < tiles)"):
            _copies(writer, plan, "copy_async", "PT_STAGE(s)", "k_lo + s * PT_TK", vec, edge)
        writer.line("pt_cp_commit();")
    with writer.block("for (int t = 0; t < tiles; ++t)"):
        writer.lines("pt_cp_wait<PT_STAGES - 2>(); // tile t has landed",
                     "__syncthreads(); // ... for every thread; stage (t - 1) is free again",
                     "const int ahead = t + PT_STAGES - 1;")
        with writer.block("if (ahead < tiles)"):
            _copies(writer, plan, "copy_async", "PT_STAGE(ahead % PT_STAGES)",
                    "k_lo + ahead * PT_TK", vec, edge)
        writer.lines("pt_cp_commit();",
                     "DTYPE *const as = PT_STAGE(t % PT_STAGES), *const bs = as + PT_A_TILE;")
        _compute_tile(writer, plan, "as", "bs")
