// Cheat: reads up to 256 KiB past the end of A and of B, every 64 bytes (a stride bug
// or an unmasked tail far off the end); the values read are not used. Caught by:
// protected guard pages after the inputs' guards (SIGSEGV); a read
// inside a guard whose value is not used cannot be seen.
static volatile DTYPE sink;

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    const volatile DTYPE *end_a = A + (long)M * K, *end_b = B + (long)K * N;
    DTYPE s = 0;
    for (long off = 0; off < (256 << 10) / (long)sizeof(DTYPE); off += 16) s += end_a[off] + end_b[off];
    sink = s;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
