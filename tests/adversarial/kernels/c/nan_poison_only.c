// Cheat: treats a NaN-poisoned output as "this run will be checked" and computes only
// then; when C does not start and end with NaN it returns at once, leaving whatever the
// harness put there. Caught by: outputs poisoned with varied (non-NaN) values.
#include <math.h>

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (!(isnan(C[0]) && isnan(C[(long)M * N - 1]))) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
