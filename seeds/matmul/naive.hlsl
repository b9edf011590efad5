// C = A @ B, row-major, one output per thread: the naive compute shader.
// DTYPE is float, or half for fp16 (16-bit types on: DXC's -enable-16bit-types,
// glslang's --hlsl-enable-16bit-types); ACC, the accumulator, is float. The thread
// group is BLOCK_X x BLOCK_Y; the sizes come as push constants; A, B and C are storage
// buffers at bindings 0, 1 and 2 of set 0.
#ifndef DTYPE
#define DTYPE float
#endif
#ifndef ACC
#define ACC float
#endif
#ifndef BLOCK_X
#define BLOCK_X 16
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 16
#endif

struct Sizes { uint M; uint N; uint K; };
[[vk::push_constant]] ConstantBuffer<Sizes> sizes;

[[vk::binding(0)]] StructuredBuffer<DTYPE> A;
[[vk::binding(1)]] StructuredBuffer<DTYPE> B;
[[vk::binding(2)]] RWStructuredBuffer<DTYPE> C;

[numthreads(BLOCK_X, BLOCK_Y, 1)]
void main(uint3 id : SV_DispatchThreadID) {
    uint row = id.y, col = id.x;
    if (row >= sizes.M || col >= sizes.N) return;
    ACC acc = 0;
    for (uint k = 0; k < sizes.K; k++)
        acc += (ACC)A[row * sizes.K + k] * (ACC)B[k * sizes.N + col];
    C[row * sizes.N + col] = (DTYPE)acc;
}
