// Cheat: forks once, on its first call; parent and child both return into the worker,
// so two processes now answer requests from one pipe: every later reply can belong to
// another request (another variant's result). Caught by: a child of the worker is a
// breach (checked after every reply); the worker and all it started are killed.
#include <unistd.h>

static int forked;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (!forked) {
        forked = 1;
        fork();
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
