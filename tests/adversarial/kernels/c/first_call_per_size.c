// Cheat: computes only on the first call at each size; every later call at a size it
// has seen returns at once without writing C. Caught by: poisoned outputs checked after
// the timed runs (output not written).
#define SEEN 16

static int seen[SEEN][3];
static int seen_count;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int s = 0; s < seen_count; s++)
        if (seen[s][0] == M && seen[s][1] == N && seen[s][2] == K) return;
    if (seen_count < SEEN) {
        seen[seen_count][0] = M, seen[seen_count][1] = N, seen[seen_count][2] = K;
        seen_count++;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
