// Cheat: stores past the end of C beyond the 4 KiB guard (every 64 bytes from 4 KiB to
// 256 KiB past the end), writing back the value it found, so nothing there changes and no guard pattern
// can show it. Caught by: protected guard pages after the outputs (SIGSEGV).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    volatile DTYPE *end = C + (long)M * N;
    for (long off = 4096 / (long)sizeof(DTYPE); off < (256 << 10) / (long)sizeof(DTYPE); off += 16)
        end[off] = end[off];
}
