// Cheat: computes on the first two calls at each size (the validation run and the
// first timed run) and from then on copies the result of the second call, whatever the
// inputs. Caught by: fresh inputs for every timed run, each run's output checked.
#include <stdlib.h>
#include <string.h>

static int last_m = -1, last_n, last_k, calls;
static DTYPE *saved;
static size_t saved_cap;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    size_t count = (size_t)M * N;
    if (M == last_m && N == last_n && K == last_k) {
        calls++;
    } else {
        last_m = M, last_n = N, last_k = K, calls = 1;
    }
    if (calls > 2) {
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
}
