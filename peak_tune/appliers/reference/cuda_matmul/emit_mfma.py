"""The AMD matrix-core kernel (`mfma`): waves of 64 lanes compute 32 x 32 tiles of C with
v_mfma_f32_32x32x8f16 (fp16 in) or v_mfma_f32_32x32x2f32 (fp32 in), fp32 accumulators.

The block of 64 * WAVES_M * WAVES_N threads copies the shared tiles as every tiled
kernel does (emit_copy: all threads, zeros outside the matrices, staged, double-buffered
or unchecked inside as the plan says); wave w owns the PT_WAVE_M x PT_WAVE_N tile at
(wr, wc) of the block tile, PT_MFMA_M x PT_MFMA_N MFMA tiles of 32 x 32, each a
`pt_floatx16` per lane. Per k step of the shared tile each wave reads its A and B
operands from the tiles in the instruction's lane layout (mfma_layout, the one place that
layout is written) and issues one MFMA per tile; the epilogue writes each lane's 16
results of each tile, checked against M and N. Any M, N, K works.

The kernel keeps the SIMT kernel's skeleton (emit.py: block position, K range, the K
loops, split-K's hand-over); this module prints the parts that differ.
"""

from __future__ import annotations

from .emit_compute import store_statement
from .mfma_layout import ACC_ELEMENTS, TILE, CExpr, a_element, b_element, d_element
from .plan import Plan
from .writer import CodeWriter

__all__ = ["MFMA_INSTRUCTIONS", "emit_mfma_accumulators", "emit_mfma_compute_tile",
           "emit_mfma_epilogue", "emit_mfma_helpers", "emit_mfma_position"]

# The builtin each element type compiles to, and its mnemonic on gfx90a / on gfx942.
MFMA_INSTRUCTIONS = {
    "float16": ("__builtin_amdgcn_mfma_f32_32x32x8f16", "v_mfma_f32_32x32x8f16",
                "v_mfma_f32_32x32x8_f16"),
    "float32": ("__builtin_amdgcn_mfma_f32_32x32x2f32", "v_mfma_f32_32x32x2f32",
                "v_mfma_f32_32x32x2_f32"),
}

_LANE, _I, _PER = CExpr("lane"), CExpr("i"), CExpr("PT_MFMA_KL")
_A_ROW, _A_K = a_element(_LANE, _I, _PER)
_B_K, _B_COL = b_element(_LANE, _I, _PER)
_D_ROW, _D_COL = d_element(_LANE, _I)

_PREAMBLE = f"""\
// mfma (AMD CDNA matrix cores): each wave64 computes 32 x 32 tiles of C with
// {MFMA_INSTRUCTIONS["float16"][0]} (fp16 in) or
// {MFMA_INSTRUCTIONS["float32"][0]} (fp32 in), accumulating in fp32.
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
static_assert(sizeof(DTYPE) == 2 || sizeof(DTYPE) == 4, "mfma needs DTYPE __half "
              "(v_mfma_f32_32x32x8f16) or float (v_mfma_f32_32x32x2f32): build this variant "
              "for float16 or float32, not float64");
static_assert(sizeof(ACC) == 4, "mfma accumulates in fp32: ACC must be float");
static_assert(BLOCK_M % ({TILE} * WAVES_M) == 0 && BLOCK_N % ({TILE} * WAVES_N) == 0,
              "the waves' {TILE} x {TILE} MFMA tiles must cover the block tile");
static_assert(PT_TK % 8 == 0, "MFMA steps are 8 (fp16) or 2 (fp32) deep: TILE_K_SIZE % 8 == 0");
typedef _Float16 pt_half4 __attribute__((ext_vector_type(4)));
typedef float pt_floatx16 __attribute__((ext_vector_type(16)));
// The operand type of one lane: 4 fp16 (K = 8 per instruction) or 1 fp32 (K = 2).
template <int BYTES> struct pt_mfma_operand;
template <> struct pt_mfma_operand<2> {{ typedef pt_half4 type; }};
template <> struct pt_mfma_operand<4> {{ typedef float type; }};
typedef pt_mfma_operand<sizeof(DTYPE)>::type pt_frag;
#define PT_MFMA_KL ((int)sizeof(DTYPE) == 2 ? 4 : 1) /* A and B elements per lane */
#define PT_MFMA_K (2 * PT_MFMA_KL) /* k per instruction */
__device__ __forceinline__ pt_floatx16 pt_mfma(pt_half4 a, pt_half4 b, pt_floatx16 c) {{
    return {MFMA_INSTRUCTIONS["float16"][0]}(a, b, c, 0, 0, 0);
}}
__device__ __forceinline__ pt_floatx16 pt_mfma(float a, float b, pt_floatx16 c) {{
    return {MFMA_INSTRUCTIONS["float32"][0]}(a, b, c, 0, 0, 0);
}}
// A operand of the MFMA tile at rows m0.., columns k0.. of the A tile: element i of
// lane l is A[m0 + l % 32][k0 + l / 32 * PT_MFMA_KL + i].
__device__ __forceinline__ pt_frag pt_mfma_a(const DTYPE *s, int m0, int k0, int lane) {{
    DTYPE e[PT_MFMA_KL];
    #pragma unroll
    for (int i = 0; i < PT_MFMA_KL; ++i) e[i] = PT_AS(s, m0 + {_A_ROW}, k0 + {_A_K});
    pt_frag f;
    __builtin_memcpy(&f, e, sizeof f);
    return f;
}}
// B operand of the MFMA tile at rows k0.., columns n0.. of the B tile: element i of
// lane l is B[k0 + l / 32 * PT_MFMA_KL + i][n0 + l % 32].
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
    writer.line("pt_floatx16 acc[PT_MFMA_M][PT_MFMA_N] = {}; // 16 fp32 per lane per MFMA tile")


def emit_mfma_compute_tile(writer: CodeWriter, plan: Plan, a_tile: str, b_tile: str) -> None:
    """One shared K tile: PT_TK / PT_MFMA_K MFMA steps per tile of the wave."""
    writer.line("#pragma unroll")
    with writer.block("for (int kk = 0; kk < PT_TK; kk += PT_MFMA_K)"):
        writer.line("pt_frag af[PT_MFMA_M], bf[PT_MFMA_N];")
        with writer.unrolled("mi", "PT_MFMA_M"):
            writer.line(f"af[mi] = pt_mfma_a({a_tile}, wr + mi * {TILE}, kk, lane);")
        with writer.unrolled("ni", "PT_MFMA_N"):
            writer.line(f"bf[ni] = pt_mfma_b({b_tile}, kk, wc + ni * {TILE}, lane);")
        with writer.unrolled("mi", "PT_MFMA_M"), writer.unrolled("ni", "PT_MFMA_N"):
            writer.line("acc[mi][ni] = pt_mfma(af[mi], bf[ni], acc[mi][ni]);")


def emit_mfma_epilogue(writer: CodeWriter, plan: Plan) -> None:
    """Element i of a lane's accumulators of tile (mi, ni): row and column as the
    instruction's result layout says; stored if inside C."""
    with writer.unrolled("mi", "PT_MFMA_M"), writer.unrolled("ni", "PT_MFMA_N"):
        with writer.unrolled("i", str(ACC_ELEMENTS)):
            writer.lines(f"const int r = bm + wr + mi * {TILE} + {_D_ROW};",
                         f"const int c = bn + wc + ni * {TILE} + {_D_COL};")
            store = store_statement(plan).format(v="acc[mi][ni][i]")
            writer.line(f"if (r < M && c < N) {store}")
