// HIP on NVIDIA GPUs (peak-tune's own header): HIP's bfloat16 is CUDA's __nv_bfloat16.
#pragma once
#include <cuda_bf16.h>
typedef __nv_bfloat16 hip_bfloat16;
