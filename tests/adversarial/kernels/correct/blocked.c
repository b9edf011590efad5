// Correct: cache blocking (64 x 64 x 64 tiles), i-k-j order inside a tile.
#define TB 64

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M * N; i++) C[i] = 0;
    for (int i0 = 0; i0 < M; i0 += TB)
        for (int k0 = 0; k0 < K; k0 += TB)
            for (int j0 = 0; j0 < N; j0 += TB)
                for (int i = i0; i < i0 + TB && i < M; i++)
                    for (int k = k0; k < k0 + TB && k < K; k++) {
                        DTYPE a = A[i * K + k];
                        for (int j = j0; j < j0 + TB && j < N; j++) C[i * N + j] += a * B[k * N + j];
                    }
}
