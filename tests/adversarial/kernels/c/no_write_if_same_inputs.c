// Cheat: keeps a copy of the last inputs; when A and B hold the same values at the same
// addresses as on the last call, it returns without writing C, assuming C still holds
// the last result. Caught by: outputs poisoned before every run; with fresh inputs for
// every run it is honest (the suite accepts it only at an honest speed).
#include <stdlib.h>
#include <string.h>

static const DTYPE *last_a, *last_b;
static DTYPE *last_c, *copy_a, *copy_b;
static size_t cap_a, cap_b;
static int last_m = -1, last_n, last_k;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    size_t na = (size_t)M * K, nb = (size_t)K * N;
    if (A == last_a && B == last_b && C == last_c && M == last_m && N == last_n &&
        K == last_k && !memcmp(A, copy_a, na * sizeof(DTYPE)) &&
        !memcmp(B, copy_b, nb * sizeof(DTYPE)))
        return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    if (cap_a < na) copy_a = realloc(copy_a, (cap_a = na) * sizeof(DTYPE));
    if (cap_b < nb) copy_b = realloc(copy_b, (cap_b = nb) * sizeof(DTYPE));
    memcpy(copy_a, A, na * sizeof(DTYPE));
    memcpy(copy_b, B, nb * sizeof(DTYPE));
    last_a = A, last_b = B, last_c = C, last_m = M, last_n = N, last_k = K;
}
