// Cheat: "bf16x2" arithmetic, what a tensor-core kernel does to look like fp32 at
// twice bf16 speed: each input split into a bf16 high part and a bf16 low part, the
// products hi*hi + hi*lo + lo*hi summed in fp32 (lo*lo dropped): about 16 mantissa
// bits where fp32 has 24. Caught by: a tolerance tight enough for fp32 at every size.
#include <stdint.h>
#include <string.h>

static float bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits &= 0xFFFF0000u;
    memcpy(&x, &bits, 4);
    return x;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) {
                float a = A[i * K + k], b = B[k * N + j];
                float ah = bf16(a), al = bf16(a - ah), bh = bf16(b), bl = bf16(b - bh);
                acc += ah * bh + (ah * bl + al * bh);
            }
            C[i * N + j] = acc;
        }
}
