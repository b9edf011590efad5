// Correct: a scratch buffer kept between calls (grown when a size needs more, never
// freed) that holds B transposed, packed afresh on every call: it keeps memory, not
// results.
#include <stdlib.h>

static DTYPE *scratch;
static size_t scratch_count;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    size_t need = (size_t)K * N;
    if (scratch_count < need) {
        free(scratch);
        scratch = malloc(sizeof(DTYPE) * need);
        scratch_count = need;
    }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) scratch[(size_t)j * K + k] = B[k * N + j];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            const DTYPE *a = &A[i * K], *bt = &scratch[(size_t)j * K];
            for (int k = 0; k < K; k++) acc += a[k] * bt[k];
            C[i * N + j] = acc;
        }
}
