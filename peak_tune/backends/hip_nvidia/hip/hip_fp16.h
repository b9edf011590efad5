// HIP on NVIDIA GPUs (peak-tune's own header): HIP's half type is CUDA's __half.
#pragma once
#include <cuda_fp16.h>
