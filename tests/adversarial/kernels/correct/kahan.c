// Correct: Kahan-compensated summation over k (more accurate than the naive sum).
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            volatile DTYPE sum = 0, carry = 0;
            for (int k = 0; k < K; k++) {
                DTYPE y = A[i * K + k] * B[k * N + j] - carry;
                DTYPE t = sum + y;
                carry = (t - sum) - y;
                sum = t;
            }
            C[i * N + j] = sum;
        }
}
