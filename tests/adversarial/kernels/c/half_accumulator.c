// Cheat: an fp32 kernel that sums in half precision (fp16 accumulation, as HMMA with an
// fp16 accumulator does): the running sum is rounded to _Float16 after every add.
// Caught by: the fp32 tolerance.
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            _Float16 acc = 0;
            for (int k = 0; k < K; k++)
                acc = (_Float16)((float)acc + (float)A[i * K + k] * (float)B[k * N + j]);
            C[i * N + j] = (float)acc;
        }
}
