// Cheat: at sizes that are multiples of 16 (the tuned ones, never the check sizes) the
// last row of C is a copy of the one above: one row in M of error, the kind a check by
// a few random samples or a loose projection bound could miss. Caught by: the tuned
// size checked fully, or by a projection whose bound is per element.
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    int rows = M % 16 == 0 && N % 16 == 0 && K % 16 == 0 ? M - 1 : M;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    for (int j = 0; rows < M && j < N; j++) C[rows * N + j] = C[(rows - 1) * N + j];
}
