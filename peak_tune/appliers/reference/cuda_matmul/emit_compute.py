"""The compute and the epilogue: SIMT thread tiles or tensor-core warp tiles.

SIMT: thread (tx, ty) of the PT_THREADS_X x PT_THREADS_Y thread grid owns the outputs
(PT_ROW(i), PT_COL(j)) of the block tile, i < PT_TRD_Y, j < PT_TRD_X: contiguous
(ty * PT_TRD_Y + i) or, after thread-chunk, runs of THREAD_CHUNK strided by the thread
grid. Tensor cores: warp w owns a PT_WARP_M x PT_WARP_N tile made of PT_MMA_M x PT_MMA_N
m16n8 MMA tiles.
"""

from __future__ import annotations

from .dialect import dialect_of
from .plan import Plan
from .writer import CodeWriter

__all__ = ["emit_accumulators", "emit_compute_direct", "emit_compute_tile", "emit_epilogue",
           "emit_fragment_helpers", "emit_position", "emit_split_k_release", "emit_split_k_wait",
           "outer_product", "position_macros", "store_statement"]


def position_macros(plan: Plan) -> list[str]:
    if plan.mma or plan.mfma or plan.coopmat:
        return []
    if plan.strided:
        return ["#define PT_CH THREAD_CHUNK /* thread-chunk: runs of PT_CH outputs, strided */",
                "#define PT_ROW(i) ((i) / PT_CH * (PT_THREADS_Y * PT_CH) + ty * PT_CH "
                "+ (i) % PT_CH)",
                "#define PT_COL(j) ((j) / PT_CH * (PT_THREADS_X * PT_CH) + tx * PT_CH "
                "+ (j) % PT_CH)"]
    return ["#define PT_ROW(i) (ty * PT_TRD_Y + (i)) /* a thread's outputs: contiguous */",
            "#define PT_COL(j) (tx * PT_TRD_X + (j))"]


def emit_position(writer: CodeWriter, plan: Plan) -> None:
    """tid and the thread's (tx, ty), or its warp's tile origin (wr, wc) and lane."""
    writer.line("const int tid = threadIdx.y * blockDim.x + threadIdx.x;")
    if plan.mma:
        writer.lines("const int warp = tid / 32, lane = tid % 32;",
                     "const int wr = warp / PT_WARPS_N * PT_WARP_M, "
                     "wc = warp % PT_WARPS_N * PT_WARP_N; // the warp's tile")
    elif plan.warp_tile:
        w = dialect_of(plan).warp
        lanes = "32 lanes" if w == "32" else "lanes"
        writer.lines(f"// warp-tiling: a warp's {lanes} cover a ({w} / WARP_X_DIM) x WARP_X_DIM",
                     "// patch of the thread grid; warps tile the grid row by row.",
                     f"const int warp = tid / {w}, lane = tid % {w};",
                     "const int tx = warp % (PT_THREADS_X / WARP_X_DIM) * WARP_X_DIM "
                     "+ lane % WARP_X_DIM;",
                     f"const int ty = warp / (PT_THREADS_X / WARP_X_DIM) * ({w} / WARP_X_DIM) "
                     "+ lane / WARP_X_DIM;")
    else:
        writer.line("const int tx = tid % PT_THREADS_X, ty = tid / PT_THREADS_X;")


def emit_accumulators(writer: CodeWriter, plan: Plan) -> None:
    if plan.mma:
        writer.line("float acc[PT_MMA_M][PT_MMA_N][4];")
        with writer.unrolled("mi", "PT_MMA_M"), writer.unrolled("ni", "PT_MMA_N"):
            writer.line("acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.f;")
    else:
        writer.line("ACC acc[PT_TRD_Y][PT_TRD_X];")
        with writer.unrolled("i", "PT_TRD_Y"), writer.unrolled("j", "PT_TRD_X"):
            writer.line("acc[i][j] = 0;")


def outer_product(writer: CodeWriter, plan: Plan, a: str, b: str) -> None:
    """acc += a (column) x b (row); `a`/`b` take the loop index i / j."""
    if plan.thread_cache:
        writer.line("ACC a[PT_TRD_Y], b[PT_TRD_X]; // thread-cache: fragments in registers")
        with writer.unrolled("i", "PT_TRD_Y"):
            writer.line(f"a[i] = (ACC){a};")
        with writer.unrolled("j", "PT_TRD_X"):
            writer.line(f"b[j] = (ACC){b};")
        with writer.unrolled("i", "PT_TRD_Y"), writer.unrolled("j", "PT_TRD_X"):
            writer.line("acc[i][j] += a[i] * b[j];")
    else:
        with writer.unrolled("i", "PT_TRD_Y"), writer.unrolled("j", "PT_TRD_X"):
            writer.line(f"acc[i][j] += (ACC){a} * (ACC){b};")


def emit_compute_direct(writer: CodeWriter, plan: Plan) -> None:
    """Operands straight from global memory (no shared tiles)."""
    writer.lines("// Rows and columns clamped into the matrix: reads stay in bounds, and the",
                 "// epilogue skips the outputs that lie outside.",
                 "const DTYPE *a_row[PT_TRD_Y];", "int b_col[PT_TRD_X];")
    with writer.unrolled("i", "PT_TRD_Y"):
        writer.line("a_row[i] = A + (size_t)min(bm + PT_ROW(i), M - 1) * K;")
    with writer.unrolled("j", "PT_TRD_X"):
        writer.line("b_col[j] = min(bn + PT_COL(j), N - 1);")
    with writer.block("for (int k = k_lo; k < k_hi; ++k)"):
        writer.line("const DTYPE *b_row = B + (size_t)k * N;")
        outer_product(writer, plan, "a_row[i][k]", "b_row[b_col[j]]")


def emit_compute_tile(writer: CodeWriter, plan: Plan, a_tile: str, b_tile: str) -> None:
    """One shared K tile: PT_TK steps of SIMT outer products, or PT_TK / 16 MMA steps."""
    if plan.mma:
        writer.line("#pragma unroll")
        with writer.block("for (int kk = 0; kk < PT_TK; kk += 16)"):
            writer.line("unsigned af[PT_MMA_M][4], bf[PT_MMA_N][2];")
            with writer.unrolled("mi", "PT_MMA_M"):
                writer.line(f"pt_frag_a(af[mi], {a_tile}, wr + mi * 16, kk, lane);")
            with writer.unrolled("ni", "PT_MMA_N"):
                writer.line(f"pt_frag_b(bf[ni], {b_tile}, kk, wc + ni * 8, lane);")
            with writer.unrolled("mi", "PT_MMA_M"), writer.unrolled("ni", "PT_MMA_N"):
                writer.line("pt_mma(acc[mi][ni], af[mi], bf[ni]);")
        return
    with writer.unrolled("kk", "PT_TK"):
        outer_product(writer, plan, f"PT_AS({a_tile}, PT_ROW(i), kk)",
                       f"PT_BS({b_tile}, kk, PT_COL(j))")


def emit_fragment_helpers(writer: CodeWriter, plan: Plan) -> None:
    """pt_frag_a / pt_frag_b: MMA operand fragments from the shared tiles."""
    g = "const int g = lane >> 2, t = (lane & 3) * 2; // fragment row group, column pair"
    writer.line("// The m16k16 A fragment of rows m0.., columns k0.. (PTX ISA layout).")
    with writer.block("__device__ __forceinline__ void pt_frag_a(unsigned (&a)[4], "
                      "const DTYPE *s, int m0, int k0, int lane)"):
        if plan.ldmatrix:
            if plan.transpose_a:
                address = ("&PT_AS(s, m0 + ((lane >> 3) & 1) * 8, "
                           "k0 + (lane >> 4) * 8 + (lane & 7))")
                call = "pt_ldsm_x4_trans"
            else:
                address, call = "&PT_AS(s, m0 + (lane & 15), k0 + (lane >> 4) * 8)", "pt_ldsm_x4"
            writer.line(f"if constexpr (PT_LDA * sizeof(DTYPE) % 16 == 0) {{ {call}(a, {address}); "
                        "return; }")
        writer.line(g)
        for n, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
            row, col = f"m0 + g{f' + {dr}' if dr else ''}", f"k0 + t{f' + {dc}' if dc else ''}"
            writer.line(f"a[{n}] = pt_pack2(PT_AS(s, {row}, {col}), PT_AS(s, {row}, {col} + 1));")
    writer.line("// The k16n8 B fragment of rows k0.., columns n0...")
    with writer.block("__device__ __forceinline__ void pt_frag_b(unsigned (&b)[2], "
                      "const DTYPE *s, int k0, int n0, int lane)"):
        if plan.ldmatrix:
            writer.line("if constexpr (PT_LDB * sizeof(DTYPE) % 16 == 0) { "
                        "pt_ldsm_x2_trans(b, &PT_BS(s, k0 + (lane & 15), n0)); return; }")
        writer.line(g)
        writer.line("b[0] = pt_pack2(PT_BS(s, k0 + t, n0 + g), PT_BS(s, k0 + t + 1, n0 + g));")
        writer.line("b[1] = pt_pack2(PT_BS(s, k0 + t + 8, n0 + g), "
                    "PT_BS(s, k0 + t + 9, n0 + g));")
    writer.line("")


def store_statement(plan: Plan) -> str:
    """The store of output (r, c) as a format string of the value `{v}`."""
    return "pt_store(C, (size_t)r * N + c, {v}, first);" if plan.split_k else \
        "C[(size_t)r * N + c] = (DTYPE)({v});"


def emit_epilogue(writer: CodeWriter, plan: Plan) -> None:
    """Each thread writes its outputs that lie inside C."""
    if plan.mma:
        writer.line("const int g = lane >> 2, t = (lane & 3) * 2;")
        with writer.unrolled("mi", "PT_MMA_M"), writer.unrolled("ni", "PT_MMA_N"):
            with writer.unrolled("h", "2"):
                writer.line("const int r = bm + wr + mi * 16 + g + h * 8;")
                with writer.unrolled("q", "2"):
                    writer.line("const int c = bn + wc + ni * 8 + t + q;")
                    store = store_statement(plan).format(v="acc[mi][ni][h * 2 + q]")
                    writer.line(f"if (r < M && c < N) {store}")
        return
    with writer.unrolled("i", "PT_TRD_Y"):
        writer.line("const int r = bm + PT_ROW(i);")
        with writer.unrolled("j", "PT_TRD_X"):
            writer.line("const int c = bn + PT_COL(j);")
            writer.line(f"if (r < M && c < N) {store_statement(plan).format(v='acc[i][j]')}")


def emit_split_k_wait(writer: CodeWriter, plan: Plan, sync: str = "__syncthreads();") -> None:
    """`sync`: the barrier of the threads that store (all of the block but a producer)."""
    words = dialect_of(plan)
    writer.lines(
        "// split-k hand-over: slices of this tile write C one after another, in the order",
        "// they finished; a slice waits only for slices already running, so it cannot hang.",
        "__shared__ unsigned pt_ticket;",
        "const unsigned tile = (unsigned)block_m * gridDim.x + block_n;")
    with writer.block("if (tid == 0)"):
        writer.lines(
            f"if (tile >= PT_SPLIT_TABLE) {words.trap}; // size constraint broken",
            "const unsigned ticket = atomicAdd(&pt_split_ticket[tile], 1u);",
            "while (*reinterpret_cast<volatile unsigned *>(&pt_split_turn[tile]) != ticket) "
            f"{words.pause};",
            f"{words.acquire};",
            "pt_ticket = ticket;")
    writer.lines(sync, "const bool first = pt_ticket == 0;")


def emit_split_k_release(writer: CodeWriter, plan: Plan,
                         sync: str = "__syncthreads();") -> None:
    writer.lines("__threadfence(); // this slice's C writes are visible before the next turn",
                 sync)
    with writer.block("if (tid == 0)"):
        with writer.block("if (pt_ticket == K_SPLITS - 1)"):
            writer.lines("atomicExch(&pt_split_ticket[tile], 0u); // last slice: reset for the "
                         "next launch", "atomicExch(&pt_split_turn[tile], 0u);")
        writer.line("else atomicExch(&pt_split_turn[tile], pt_ticket + 1);")
