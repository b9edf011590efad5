// Correct: explicit 8-wide vectors (GCC vector extensions) over j, with a scalar tail,
// unaligned loads and stores through memcpy.
#include <string.h>

typedef DTYPE vec __attribute__((vector_size(8 * sizeof(DTYPE))));

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++) {
        int j = 0;
        for (; j + 8 <= N; j += 8) {
            vec acc = {0};
            for (int k = 0; k < K; k++) {
                vec b;
                memcpy(&b, &B[k * N + j], sizeof b);
                acc += A[i * K + k] * b;
            }
            memcpy(&C[i * N + j], &acc, sizeof acc);
        }
        for (; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    }
}
