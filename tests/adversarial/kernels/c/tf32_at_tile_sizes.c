// Cheat: detects validation vs tuning by the sizes. The check sizes are multiples of
// no tile; at sizes that are multiples of 16 (the tuned ones) it switches to TF32
// inputs. Caught by: the tuned size checked too, with a tolerance TF32 fails.
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
    int tuned = M % 16 == 0 && N % 16 == 0 && K % 16 == 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) {
                float a = A[i * K + k], b = B[k * N + j];
                acc += tuned ? tf32(a) * tf32(b) : a * b;
            }
            C[i * N + j] = acc;
        }
}
