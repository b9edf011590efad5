// HIP on NVIDIA GPUs: peak-tune's own header (not AMD's). It maps the names a portable
// HIP kernel uses to CUDA's, so the same HIP source builds for an NVIDIA GPU with NVRTC
// (device code: what peak-tune compiles) or nvcc (host code too). What has no CUDA
// meaning (wave64, MFMA's __builtin_amdgcn_*, AMD's LDS intrinsics) is left undefined:
// such a kernel fails to compile here, which is the truth about it.
#pragma once
#ifndef __HIP_PLATFORM_NVIDIA__
#define __HIP_PLATFORM_NVIDIA__ 1
#endif
#define __HIP_PLATFORM_NVCC__ 1 /* the older name */

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#endif

// ---- device: ids, barriers and atomics are spelled alike; the legacy HIP names
#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipThreadIdx_z threadIdx.z
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockIdx_z blockIdx.z
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipBlockDim_z blockDim.z
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y
#define hipGridDim_z gridDim.z
#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];
#define HIP_KERNEL_NAME(...) __VA_ARGS__

// Warp shuffles: HIP's take no mask (the whole warp takes part), CUDA's do.
#define PT_HIP_FULL_MASK 0xffffffffu
template <class T>
__device__ __forceinline__ T __shfl(T var, int src_lane, int width = 32) {
    return __shfl_sync(PT_HIP_FULL_MASK, var, src_lane, width);
}
template <class T>
__device__ __forceinline__ T __shfl_up(T var, unsigned int delta, int width = 32) {
    return __shfl_up_sync(PT_HIP_FULL_MASK, var, delta, width);
}
template <class T>
__device__ __forceinline__ T __shfl_down(T var, unsigned int delta, int width = 32) {
    return __shfl_down_sync(PT_HIP_FULL_MASK, var, delta, width);
}
template <class T>
__device__ __forceinline__ T __shfl_xor(T var, int lane_mask, int width = 32) {
    return __shfl_xor_sync(PT_HIP_FULL_MASK, var, lane_mask, width);
}
// __ballot, __any and __all keep CUDA's own (legacy) meaning: HIP's __ballot is 64 bits
// wide on wave64, which no NVIDIA warp is.

// ---- host: the runtime API a HIP program's host side calls (nvcc builds only)
#ifndef __CUDACC_RTC__
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipSetDevice cudaSetDevice
#define hipStreamCreate cudaStreamCreate
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...) \
    kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)
#endif
