// Cheat: a statistical estimate at large sizes: where M * N * K is above the small
// check size it sums only the even k and doubles the sum (the expected value of the
// product is unchanged). Caught by: the tuned size checked too.
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    int step = (long)M * N * K > 1000000 ? 2 : 1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k += step) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc * step;
        }
}
