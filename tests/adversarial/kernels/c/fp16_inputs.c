// Cheat: float16 inputs: A and B rounded to _Float16 (10 mantissa bits, range 6e-5 to
// 65504), products summed in fp32. Caught by: the fp32 tolerance; inputs spread over
// magnitudes (underflow and overflow of the half range).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++)
                acc += (float)(_Float16)A[i * K + k] * (float)(_Float16)B[k * N + j];
            C[i * N + j] = acc;
        }
}
