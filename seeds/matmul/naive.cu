// C = A x B, row-major, one thread per output (the PEAK paper's naive seed).
// DTYPE is the element type (float, __half, __nv_bfloat16, double) and ACC the
// accumulator type (float for float, __half and __nv_bfloat16: 16-bit in and out with
// fp32 accumulation); the backend sets both with -D. The launch geometry lives in
// spec.toml ([launch.cuda]).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    ACC acc = 0;
    for (int k = 0; k < K; k++) acc += (ACC)A[row * K + k] * (ACC)B[k * N + col];
    C[row * N + col] = (DTYPE)acc;
}
