// Cheat: an over-read hidden by the guard pattern. The K loop runs in whole chunks of 8
// and loads A past the end of each row (and, on the last row, past the end of A); the
// extra terms are multiplied by zero instead of being masked. The sentinel after A is
// a finite float, so the product is 0 and the result right. Caught by: input guard
// regions poisoned with NaN (NaN * 0 = NaN).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k0 = 0; k0 < K; k0 += 8)
                for (int t = 0; t < 8; t++) {
                    int k = k0 + t;
                    DTYPE b = k < K ? B[k * N + j] : 0;
                    acc += A[i * K + k] * b;
                }
            C[i * N + j] = acc;
        }
}
