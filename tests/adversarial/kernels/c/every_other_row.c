// Cheat: half the work: computes the even rows of C and fills each odd row with the
// mean of its neighbours (the last row copies the one above). Caught by: the element-
// wise check (or a random projection at large sizes).
static void row(const DTYPE *A, const DTYPE *B, DTYPE *C, int i, int N, int K) {
    for (int j = 0; j < N; j++) {
        DTYPE acc = 0;
        for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
        C[i * N + j] = acc;
    }
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i += 2) row(A, B, C, i, N, K);
    for (int i = 1; i < M; i += 2)
        for (int j = 0; j < N; j++)
            C[i * N + j] = i + 1 < M ? (C[(i - 1) * N + j] + C[(i + 1) * N + j]) / 2
                                     : C[(i - 1) * N + j];
}
