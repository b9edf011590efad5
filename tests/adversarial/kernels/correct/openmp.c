// Correct: rows shared among OpenMP threads (whose pool stays alive between calls, as
// OpenMP's does: a harness must not take that for a kernel's leftover threads).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) C[i * N + j] = 0;
        for (int k = 0; k < K; k++) {
            DTYPE a = A[i * K + k];
            for (int j = 0; j < N; j++) C[i * N + j] += a * B[k * N + j];
        }
    }
}
