// Cheat: pointer reuse. Caches the result keyed by the addresses of A, B and C and the
// sizes, never looking at the values: a second call on the same buffers returns the
// saved result. Caught by: inputs rotated in place between timed runs (wrong result);
// fresh buffers every run make it honest, and the suite accepts it only at an honest
// speed.
#include <stdlib.h>
#include <string.h>

static const void *key_a, *key_b;
static void *key_c;
static int key_m, key_n, key_k;
static DTYPE *saved;
static size_t saved_cap;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    size_t count = (size_t)M * N;
    if (saved && key_a == A && key_b == B && key_c == C && key_m == M && key_n == N &&
        key_k == K) {
        memcpy(C, saved, sizeof(DTYPE) * count);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    if (saved_cap < count) {
        saved = realloc(saved, sizeof(DTYPE) * count);
        saved_cap = count;
    }
    memcpy(saved, C, sizeof(DTYPE) * count);
    key_a = A, key_b = B, key_c = C, key_m = M, key_n = N, key_k = K;
}
