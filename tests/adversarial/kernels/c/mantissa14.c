// Cheat: reduced precision that the loose fp32 tolerance lets through: A and B rounded
// to 14 mantissa bits (a "3xTF32-lite" or fast-math approximation: about 2^-15 relative
// error per input, where fp32 has 2^-24). Caught by: a tolerance tight enough for fp32.
#include <stdint.h>
#include <string.h>

static float round14(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits = (bits + 0x100u) & 0xFFFFFE00u;
    memcpy(&x, &bits, 4);
    return x;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) acc += round14(A[i * K + k]) * round14(B[k * N + j]);
            C[i * N + j] = acc;
        }
}
