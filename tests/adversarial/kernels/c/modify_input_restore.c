// Cheat: uses the const input A as scratch: doubles it in place, computes with it,
// halves the result and restores A (both exact in binary floating point), so A is
// unchanged when the call returns. Caught by: inputs mapped read-only while the kernel
// runs (SIGSEGV); a copy-and-compare after the run cannot see it.
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    DTYPE *a = (DTYPE *)A;
    for (long i = 0; i < (long)M * K; i++) a[i] *= 2;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += a[i * K + k] * B[k * N + j];
            C[i * N + j] = acc / 2;
        }
    for (long i = 0; i < (long)M * K; i++) a[i] /= 2;
}
