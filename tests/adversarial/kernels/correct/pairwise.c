// Correct: another summation order: pairwise (recursive halving) sums of the products.
static DTYPE pairwise(const DTYPE *a, const DTYPE *B, int N, int j, int k0, int k1) {
    if (k1 - k0 <= 8) {
        DTYPE s = 0;
        for (int k = k0; k < k1; k++) s += a[k] * B[k * N + j];
        return s;
    }
    int mid = k0 + (k1 - k0) / 2;
    return pairwise(a, B, N, j, k0, mid) + pairwise(a, B, N, j, mid, k1);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[i * N + j] = pairwise(&A[i * K], B, N, j, 0, K);
}
