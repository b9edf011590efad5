"""The words a plan is printed in: CUDA, or HIP (for AMD GPUs and, through the project's
HIP-on-CUDA header, NVIDIA ones).

The SIMT kernel is the same program in both: thread and block ids, `__shared__`,
`__syncthreads`, `__launch_bounds__`, vector types and atomics are spelled alike. What
differs is the headers, the warp (32 lanes on NVIDIA, a wavefront of 64 on CDNA), and
a few intrinsics of the split-K hand-over. HIP source names them through PT_ macros
that its preamble defines per platform, so one HIP source builds for either.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan

__all__ = ["CUDA", "HIP", "Dialect", "dialect_of"]


@dataclass(frozen=True)
class Dialect:
    name: str
    preamble: str  # the headers (and, for HIP, the PT_ macros below)
    warp: str  # lanes per warp, in C
    trap: str  # stop the kernel: an impossible launch or a broken size constraint
    pause: str  # back off while spinning on a turn counter
    acquire: str  # after the turn is ours: see the other slices' writes to C
    load_l2: str  # a load that no stale line of this SM's / CU's L1 can answer


CUDA = Dialect(
    name="cuda",
    preamble="#include <cuda_fp16.h>\n#include <cuda_bf16.h>",
    warp="32", trap="__trap()", pause="__nanosleep(64)", acquire="__threadfence()",
    load_l2="__ldcg")

_HIP_PREAMBLE = """\
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
// HIP: what differs between AMD and NVIDIA GPUs, per platform.
#if defined(__HIP_PLATFORM_AMD__) || defined(__AMDGCN__)
#define PT_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE /* 64 lanes on CDNA (gfx9) */
#define PT_TRAP() __builtin_trap()
#define PT_PAUSE() __builtin_amdgcn_s_sleep(1)
/* an acquire at agent scope drops the CU's L1 (it is not coherent with other CUs) */
#define PT_ACQUIRE() __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent")
#define PT_LOAD_L2(p) (*(p))
#else
#define PT_WARP_SIZE 32
#define PT_TRAP() __trap()
#define PT_PAUSE() __nanosleep(64)
#define PT_ACQUIRE() __threadfence()
#define PT_LOAD_L2(p) __ldcg(p)
#endif"""

HIP = Dialect(
    name="hip", preamble=_HIP_PREAMBLE, warp="PT_WARP_SIZE", trap="PT_TRAP()",
    pause="PT_PAUSE()", acquire="PT_ACQUIRE()", load_l2="PT_LOAD_L2")


def dialect_of(plan: Plan) -> Dialect:
    return HIP if plan.hip else CUDA
