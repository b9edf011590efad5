"""Hand-written device helpers the transformations insert verbatim (PTX wrappers).

Each is the code a transformation's text gives the LLM to paste; the emitter includes
only the ones its plan uses.
"""

from __future__ import annotations

__all__ = ["CP_ASYNC", "LDMATRIX", "MMA", "SPLIT_K_TABLE", "SPLIT_K_TABLE_SIZE"]

SPLIT_K_TABLE_SIZE = 262144  # output tiles the split-K hand-over can track per launch

SPLIT_K_TABLE = f"""\
// Split-K hand-over: per output tile, a ticket counter (slices that finished their
// K range) and a turn counter (slices that have written C). Zero when the module
// loads; the last slice of a tile puts both back to zero, so every launch starts clean.
#define PT_SPLIT_TABLE {SPLIT_K_TABLE_SIZE}
__device__ unsigned int pt_split_ticket[PT_SPLIT_TABLE];
__device__ unsigned int pt_split_turn[PT_SPLIT_TABLE];"""

CP_ASYNC = """\
// cp.async (sm_80+): copy BYTES (4, 8 or 16) from global to shared memory without
// registers; `valid` false writes zeros instead (src-size 0, nothing is read).
template <int BYTES>
__device__ __forceinline__ void pt_cp_async(void *dst, const void *src, bool valid) {
#if __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int n = valid ? BYTES : 0;
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n"
                     :: "r"(s), "l"(src), "r"(n));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\\n"
                     :: "r"(s), "l"(src), "n"(BYTES), "r"(n));
#else
    unsigned char *d = static_cast<unsigned char *>(dst);
    const unsigned char *g = static_cast<const unsigned char *>(src);
    for (int b = 0; b < BYTES; ++b) d[b] = valid ? g[b] : 0;
#endif
}
__device__ __forceinline__ void pt_cp_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\\n" ::);
#endif
}
template <int PENDING>
__device__ __forceinline__ void pt_cp_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\\n" :: "n"(PENDING));
#endif
}"""

MMA = """\
// Tensor cores: mma.sync m16n8k16, fp16 or bf16 inputs, fp32 accumulation (sm_80+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "tensor-core: mma.sync m16n8k16 needs sm_80 or newer"
#endif
static_assert(sizeof(DTYPE) == 2, "tensor-core needs DTYPE __half or __nv_bfloat16 (fp16/bf16 "
              "inputs, fp32 accumulation): build this variant for float16, not float32/64");
static_assert(sizeof(ACC) == 4, "tensor-core accumulates in fp32: ACC must be float");
template <class T> struct pt_is_bf16 { static constexpr bool value = false; };
template <> struct pt_is_bf16<__nv_bfloat16> { static constexpr bool value = true; };
__device__ __forceinline__ unsigned pt_pack2(DTYPE lo, DTYPE hi) {
    unsigned short l, h;
    memcpy(&l, &lo, 2);
    memcpy(&h, &hi, 2);
    return static_cast<unsigned>(l) | (static_cast<unsigned>(h) << 16);
}
// c += a (16x16, row) * b (16x8, col); fragment layouts as in the PTX ISA for m16n8k16.
__device__ __forceinline__ void pt_mma(float (&c)[4], const unsigned (&a)[4],
                                       const unsigned (&b)[2]) {
    if constexpr (pt_is_bf16<DTYPE>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}"""

LDMATRIX = """\
// ldmatrix (sm_75+): a warp loads 8x8 16-bit matrices from shared memory; each lane
// gives the address of one 16-byte row. .trans delivers the transposed matrices.
__device__ __forceinline__ void pt_ldsm_x4(unsigned (&r)[4], const DTYPE *p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void pt_ldsm_x4_trans(unsigned (&r)[4], const DTYPE *p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void pt_ldsm_x2_trans(unsigned (&r)[2], const DTYPE *p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}"""
