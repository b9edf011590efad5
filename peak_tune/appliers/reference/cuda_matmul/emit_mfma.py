"""The AMD matrix-core kernel (`mfma`): waves of 64 lanes compute MFMA_TILE x MFMA_TILE
tiles of C (32 or 16, a tuning value) with v_mfma_f32_32x32x8f16 / _16x16x16f16 (fp16
in) or v_mfma_f32_32x32x2f32 / _16x16x4f32 (fp32 in), fp32 accumulators.

The block of 64 * WAVES_M * WAVES_N threads copies the shared tiles as every tiled
kernel does (emit_copy: all threads, zeros outside the matrices, staged, double-buffered
or unchecked inside as the plan says); wave w owns the PT_WAVE_M x PT_WAVE_N tile at
(wr, wc) of the block tile, PT_MFMA_M x PT_MFMA_N MFMA tiles, each a `pt_acc` of
PT_MFMA_ACC floats per lane (16 or 4). Per k step of the shared tile each wave reads its
A and B operands from the tiles in the instruction's lane layout (mfma_layout, the one
place that layout is written) and issues one MFMA per tile; the epilogue writes each
lane's results of each tile, checked against M and N. Any M, N, K works.

The kernel keeps the SIMT kernel's skeleton (emit.py: block position, K range, the K
loops, split-K's hand-over); this module prints the parts that differ.
"""

from __future__ import annotations

from .emit_compute import store_statement
from .mfma_layout import CExpr, a_element, accumulators, b_element, d_element
from .plan import Plan
from .writer import CodeWriter

__all__ = ["MFMA_INSTRUCTIONS", "emit_mfma_accumulators", "emit_mfma_compute_tile",
           "emit_mfma_epilogue", "emit_mfma_helpers", "emit_mfma_position"]

# (element type, MFMA_TILE) -> the builtin it compiles to, and its mnemonic on gfx90a /
# on gfx942
MFMA_INSTRUCTIONS = {
    ("float16", 32): ("__builtin_amdgcn_mfma_f32_32x32x8f16", "v_mfma_f32_32x32x8f16",
                      "v_mfma_f32_32x32x8_f16"),
    ("float32", 32): ("__builtin_amdgcn_mfma_f32_32x32x2f32", "v_mfma_f32_32x32x2f32",
                      "v_mfma_f32_32x32x2_f32"),
    ("float16", 16): ("__builtin_amdgcn_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16f16",
                      "v_mfma_f32_16x16x16_f16"),
    ("float32", 16): ("__builtin_amdgcn_mfma_f32_16x16x4f32", "v_mfma_f32_16x16x4f32",
                      "v_mfma_f32_16x16x4_f32"),
}

_LANE, _I, _PER, _T = CExpr("lane"), CExpr("i"), CExpr("PT_MFMA_KL"), CExpr("MFMA_TILE")
_A_ROW, _A_K = a_element(_LANE, _I, _PER, _T)
_B_K, _B_COL = b_element(_LANE, _I, _PER, _T)
_D_ROW, _D_COL = d_element(_LANE, _I, _T, CExpr("PT_MFMA_DROWS"))


def _builtin(dtype: str, operands: str) -> str:
    """pt_mfma for one operand type: the instruction of the tile MFMA_TILE names."""
    big, small = MFMA_INSTRUCTIONS[(dtype, 32)][0], MFMA_INSTRUCTIONS[(dtype, 16)][0]
    return f"""\
__device__ __forceinline__ pt_acc pt_mfma({operands}, pt_acc c) {{
#if MFMA_TILE == 32
    return {big}(a, b, c, 0, 0, 0);
#else
    return {small}(a, b, c, 0, 0, 0);
#endif
}}"""


_PREAMBLE = f"""\
// mfma (AMD CDNA matrix cores): each wave64 computes MFMA_TILE x MFMA_TILE tiles of C with
// {MFMA_INSTRUCTIONS["float16", 32][0]} / _16x16x16f16 (fp16 in) or
// {MFMA_INSTRUCTIONS["float32", 32][0]} / _16x16x4f32 (fp32 in), accumulating in fp32.
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__AMDGCN__)
#error "mfma is AMD-only: build this variant for an AMD GPU (MFMA does not exist on NVIDIA)"
#endif
#if defined(__AMDGCN__) && !defined(__gfx908__) && !defined(__gfx90a__) \\
    && !defined(__gfx940__) && !defined(__gfx941__) && !defined(__gfx942__)
#error "mfma needs a CDNA GPU with matrix cores (gfx908, gfx90a, gfx940-gfx942)"
#endif
#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 64
#error "mfma: the MFMA lane layouts are for waves of 64 lanes"
#endif
#if MFMA_TILE == 32
#define PT_MFMA_ACC {accumulators(32)} /* fp32 results per lane of one tile */
#elif MFMA_TILE == 16
#define PT_MFMA_ACC {accumulators(16)}
#else
#error "mfma: MFMA_TILE must be 16 or 32 (the tiles of the MFMA instructions)"
#endif
#define PT_MFMA_DROWS (256 / MFMA_TILE) /* the rows one block of 4 results spans */
static_assert(sizeof(DTYPE) == 2 || sizeof(DTYPE) == 4, "mfma needs DTYPE __half "
              "(v_mfma_f32_*f16) or float (v_mfma_f32_*f32): build this variant "
              "for float16 or float32, not float64");
static_assert(sizeof(ACC) == 4, "mfma accumulates in fp32: ACC must be float");
static_assert(BLOCK_M % (MFMA_TILE * WAVES_M) == 0 && BLOCK_N % (MFMA_TILE * WAVES_N) == 0,
              "the waves' MFMA tiles must cover the block tile");
typedef _Float16 pt_half4 __attribute__((ext_vector_type(4)));
typedef float pt_acc __attribute__((ext_vector_type(PT_MFMA_ACC)));
// The operand type of one lane: 4 fp16 or 1 fp32.
template <int BYTES> struct pt_mfma_operand;
template <> struct pt_mfma_operand<2> {{ typedef pt_half4 type; }};
template <> struct pt_mfma_operand<4> {{ typedef float type; }};
typedef pt_mfma_operand<sizeof(DTYPE)>::type pt_frag;
#define PT_MFMA_KL ((int)sizeof(DTYPE) == 2 ? 4 : 1) /* A and B elements per lane */
#define PT_MFMA_K (64 / MFMA_TILE * PT_MFMA_KL) /* k per instruction: 8, 2, 16 or 4 */
static_assert(PT_TK % PT_MFMA_K == 0, "TILE_K_SIZE must be a multiple of the MFMA's k "
              "(fp16: 8 for MFMA_TILE 32, 16 for 16; fp32: 2 or 4)");
{_builtin("float16", "pt_half4 a, pt_half4 b")}
{_builtin("float32", "float a, float b")}
// A operand of the MFMA tile at rows m0.., columns k0.. of the A tile: element i of
// lane l is A[m0 + l % MFMA_TILE][k0 + l / MFMA_TILE * PT_MFMA_KL + i].
__device__ __forceinline__ pt_frag pt_mfma_a(const DTYPE *s, int m0, int k0, int lane) {{
    DTYPE e[PT_MFMA_KL];
    #pragma unroll
    for (int i = 0; i < PT_MFMA_KL; ++i) e[i] = PT_AS(s, m0 + {_A_ROW}, k0 + {_A_K});
    pt_frag f;
    __builtin_memcpy(&f, e, sizeof f);
    return f;
}}
// B operand of the MFMA tile at rows k0.., columns n0.. of the B tile: element i of
// lane l is B[k0 + l / MFMA_TILE * PT_MFMA_KL + i][n0 + l % MFMA_TILE].
__device__ __forceinline__ pt_frag pt_mfma_b(const DTYPE *s, int k0, int n0, int lane) {{
    DTYPE e[PT_MFMA_KL];
    #pragma unroll
    for (int i = 0; i < PT_MFMA_KL; ++i) e[i] = PT_BS(s, k0 + {_B_K}, n0 + {_B_COL});
    pt_frag f;
    __builtin_memcpy(&f, e, sizeof f);
    return f;
}}"""


def emit_mfma_helpers(writer: CodeWriter, plan: Plan) -> None:
    writer.raw(_PREAMBLE)
    writer.line("")


def emit_mfma_position(writer: CodeWriter, plan: Plan) -> None:
    """tid, the wave's tile origin (wr, wc) and the lane."""
    writer.lines("const int tid = threadIdx.y * blockDim.x + threadIdx.x;",
                 "const int wave = tid / 64, lane = tid % 64;",
                 "const int wr = wave / WAVES_N * PT_WAVE_M, "
                 "wc = wave % WAVES_N * PT_WAVE_N; // the wave's tile")


def emit_mfma_accumulators(writer: CodeWriter, plan: Plan) -> None:
    writer.line("pt_acc acc[PT_MFMA_M][PT_MFMA_N] = {}; // PT_MFMA_ACC fp32 per lane per tile")


def emit_mfma_compute_tile(writer: CodeWriter, plan: Plan, a_tile: str, b_tile: str) -> None:
    """One shared K tile: PT_TK / PT_MFMA_K MFMA steps per tile of the wave."""
    writer.line("#pragma unroll")
    with writer.block("for (int kk = 0; kk < PT_TK; kk += PT_MFMA_K)"):
        writer.line("pt_frag af[PT_MFMA_M], bf[PT_MFMA_N];")
        with writer.unrolled("mi", "PT_MFMA_M"):
            writer.line(f"af[mi] = pt_mfma_a({a_tile}, wr + mi * MFMA_TILE, kk, lane);")
        with writer.unrolled("ni", "PT_MFMA_N"):
            writer.line(f"bf[ni] = pt_mfma_b({b_tile}, kk, wc + ni * MFMA_TILE, lane);")
        with writer.unrolled("mi", "PT_MFMA_M"), writer.unrolled("ni", "PT_MFMA_N"):
            writer.line("acc[mi][ni] = pt_mfma(af[mi], bf[ni], acc[mi][ni]);")


def emit_mfma_epilogue(writer: CodeWriter, plan: Plan) -> None:
    """Element i of a lane's accumulators of tile (mi, ni): row and column as the
    instruction's result layout says; stored if inside C."""
    with writer.unrolled("mi", "PT_MFMA_M"), writer.unrolled("ni", "PT_MFMA_N"):
        with writer.unrolled("i", "PT_MFMA_ACC"):
            writer.lines(f"const int r = bm + wr + mi * MFMA_TILE + {_D_ROW};",
                         f"const int c = bn + wc + ni * MFMA_TILE + {_D_COL};")
            store = store_statement(plan).format(v="acc[mi][ni][i]")
            writer.line(f"if (r < M && c < N) {store}")
