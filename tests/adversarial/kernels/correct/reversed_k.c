// Correct: the k loop run backwards, eight partial sums (a reassociated order).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE part[8] = {0};
            for (int k = K - 1; k >= 0; k--) part[k % 8] += A[i * K + k] * B[k * N + j];
            DTYPE s = 0;
            for (int p = 0; p < 8; p++) s += part[p];
            C[i * N + j] = s;
        }
}
