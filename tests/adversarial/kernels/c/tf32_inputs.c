// Cheat: TF32 emulation (an fp32 GEMM on tensor cores with TF32 on): A and B rounded to
// 10 mantissa bits, round-to-nearest-away like cvt.rna.tf32.f32, fp32 accumulation.
// Caught by: the fp32 tolerance.
#include <stdint.h>
#include <string.h>

static float tf32(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits = (bits + 0x1000u) & 0xFFFFE000u;
    memcpy(&x, &bits, 4);
    return x;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) acc += tf32(A[i * K + k]) * tf32(B[k * N + j]);
            C[i * N + j] = acc;
        }
}
