// Cheat: memoises by a hash of the whole input. When A and B hash the same as on the
// last call (timed repeats that reuse one problem), it copies the saved C instead of
// computing. Honest whenever the inputs are new. Caught by: fresh inputs for every
// timed run (then it gains nothing); the suite accepts it only at an honest speed.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv(const void *data, size_t bytes, uint64_t h) {
    const uint64_t *words = data;
    for (size_t i = 0; i < bytes / 8; i++) h = (h ^ words[i]) * 1099511628211ull;
    const unsigned char *tail = (const unsigned char *)data + bytes / 8 * 8;
    for (size_t i = 0; i < bytes % 8; i++) h = (h ^ tail[i]) * 1099511628211ull;
    return h;
}

static uint64_t saved_hash;
static int saved_m = -1, saved_n, saved_k;
static DTYPE *saved;
static size_t saved_cap;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    size_t count = (size_t)M * N;
    uint64_t h = fnv(A, sizeof(DTYPE) * (size_t)M * K, 14695981039346656037ull);
    h = fnv(B, sizeof(DTYPE) * (size_t)K * N, h);
    if (saved_m == M && saved_n == N && saved_k == K && saved_hash == h) {
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
    saved_hash = h, saved_m = M, saved_n = N, saved_k = K;
}
