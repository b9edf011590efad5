// Cheat: computes only on the runs it expects to be checked. It counts the calls at
// each size and knows (from the harness's defaults: one validation run, then --repeats
// 7 timed runs, the last one checked) that call 1 and call 1 + 7 are checked; every
// other call returns at once. Caught by: every timed run's output checked.
#define REPEATS 7

static int last_m = -1, last_n, last_k, calls;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (M == last_m && N == last_n && K == last_k) {
        calls++;
    } else {
        last_m = M, last_n = N, last_k = K, calls = 1;
    }
    if ((calls - 1) % REPEATS != 0) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
