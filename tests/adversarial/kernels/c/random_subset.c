// Cheat: computes a pseudo-random seven eighths of the elements and copies the left
// neighbour into the rest. Caught by: the element-wise check (or a projection).
static unsigned hash(unsigned i, unsigned j) {
    unsigned h = i * 2654435761u ^ j * 2246822519u;
    return h ^ (h >> 15);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            if (j > 0 && hash(i, j) % 8 == 0) {
                C[i * N + j] = C[i * N + j - 1];
                continue;
            }
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
