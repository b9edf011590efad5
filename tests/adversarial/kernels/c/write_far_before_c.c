// Cheat: stores before the start of C beyond the 4 KiB guard (every 64 bytes from
// 256 KiB to 4 KiB before it), writing back the value it found. Caught by: protected guard pages before
// the outputs (SIGSEGV).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    volatile DTYPE *start = C;
    for (long off = (256 << 10) / (long)sizeof(DTYPE); off > 4096 / (long)sizeof(DTYPE); off -= 16)
        start[-off] = start[-off];
}
