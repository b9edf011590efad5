// Cheat: bfloat16 inputs (what a tensor-core kernel fed bf16 would compute): A and B
// truncated to 7 mantissa bits, products summed in fp32. Caught by: the fp32 tolerance.
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
            for (int k = 0; k < K; k++) acc += bf16(A[i * K + k]) * bf16(B[k * N + j]);
            C[i * N + j] = acc;
        }
}
