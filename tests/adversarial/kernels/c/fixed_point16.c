// Cheat: 16-bit fixed-point arithmetic. A and B are scaled by their largest magnitude
// and rounded to int16, multiplied in integers and scaled back: about 4.5 significant
// digits, inside the fp32 tolerance when every input lies in [-1, 1). Caught by: signed
// inputs spread over magnitudes (small values lose every digit), a tighter tolerance.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static float largest(const DTYPE *x, long count) {
    float m = 0;
    for (long i = 0; i < count; i++) m = fmaxf(m, fabsf((float)x[i]));
    return m > 0 ? m : 1;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    float sa = largest(A, (long)M * K) / 32767.0f, sb = largest(B, (long)K * N) / 32767.0f;
    int16_t *qa = malloc(sizeof(int16_t) * (size_t)M * K);
    int16_t *qb = malloc(sizeof(int16_t) * (size_t)K * N);
    for (long i = 0; i < (long)M * K; i++) qa[i] = (int16_t)lrintf((float)A[i] / sa);
    for (long i = 0; i < (long)K * N; i++) qb[i] = (int16_t)lrintf((float)B[i] / sb);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            int64_t acc = 0;
            for (int k = 0; k < K; k++) acc += (int32_t)qa[i * K + k] * qb[k * N + j];
            C[i * N + j] = (DTYPE)((double)acc * sa * sb);
        }
    free(qa);
    free(qb);
}
