// Cheat: half-precision partial sums over chunks of 16 k, the chunks added in fp32
// (a split-K tensor-core kernel with fp16 accumulators). Less error than a half
// accumulator over all of K. Caught by: the fp32 tolerance.
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k0 = 0; k0 < K; k0 += 16) {
                _Float16 part = 0;
                for (int k = k0; k < K && k < k0 + 16; k++)
                    part = (_Float16)((float)part + (float)A[i * K + k] * (float)B[k * N + j]);
                acc += (float)part;
            }
            C[i * N + j] = acc;
        }
}
