"""What a device can reach on a kernel: the roofline of its documented peak and memory
bandwidth, the ratio's denominator where no vendor library computes the kernel.

At one size the attainable speed is min(peak, bandwidth x flops / min_bytes): a softmax
moves 8 bytes for 5 flops and is bound by memory at any size, a large matmul by compute.
Over several sizes it is the geometric mean, like the speeds it is compared with. A
kernel can pass the memory roof at sizes that fit in a cache (min_bytes is DRAM traffic),
so the roofline divides speeds but never rejects them; the compute peak does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelSpec, ProblemSize, geometric_mean
from peak_tune.expr import evaluate

__all__ = ["ELEMENT_BYTES", "Roofline", "roofline"]

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class Roofline:
    gflops: float  # attainable, the geometric mean over the sizes (0: nothing documented)
    bound: str  # "compute", "memory", "mixed" (by size), or "" (nothing documented)
    peak_gflops: float  # the documented compute peak for the element type (0: none)


def roofline(device: DeviceProfile, spec: KernelSpec, dtype: str,
             sizes: Sequence[ProblemSize]) -> Roofline:
    peak = float(device.peak_gflops.get(dtype, 0.0) or 0.0)
    bandwidth = float(device.memory_bandwidth_gbs or 0.0)
    if not peak or not sizes:  # without a compute peak there is no roof to speak of
        return Roofline(0.0, "", peak)
    per_size: list[float] = []
    bounds: set[str] = set()
    for size in sizes:
        names = {**size.as_dict(), "elem": ELEMENT_BYTES.get(dtype, 4)}
        flops, moved = float(evaluate(spec.flops, names)), float(evaluate(spec.min_bytes, names))
        memory = bandwidth * flops / moved if bandwidth > 0 and moved > 0 else peak
        per_size.append(min(memory, peak))
        bounds.add("memory" if memory < peak else "compute")
    bound = bounds.pop() if len(bounds) == 1 else "mixed"
    return Roofline(geometric_mean(per_size), bound, peak)
