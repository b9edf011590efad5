"""Reference transformations of the matmul compute shader: the GPU matmul's plans and
rules (cuda_matmul), printed as HLSL for Vulkan (emit.py) from the HLSL seed (lift.py).

The steps an HLSL shader has are the SIMT ones (plan.HLSL_PARTS): refactor, tb-tiling
through groupshared memory, thread-tiling (the PEAK paper's HLSL sequence), and
thread-cache, thread-chunk, warp-tiling (waves of the device's subgroup size), transpose,
offset, vector-loads, register-staging,
double-buffer, interior-tiles and block-swizzle; and two of its own, cooperative-matrix
(Vulkan's tensor-core tiles, printed as Slang: emit.py) and wave-broadcast (the
thread-cache fragments shared between a wave's lanes with WaveReadLaneAt: wave.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from peak_tune.appliers.reference.cuda_matmul import CudaMatmul
from peak_tune.appliers.reference.cuda_matmul.plan import Plan
from peak_tune.appliers.reference.cuda_matmul.rules import RULES, Rule

from .emit import emit_shader, launch_of
from .lift import lift_seed

__all__ = ["HLSL_STEPS", "HlslMatmul", "emit_shader"]

HLSL_STEPS = ("refactor", "tb-tiling", "thread-tiling", "thread-cache", "thread-chunk",
              "warp-tiling", "transpose", "offset", "vector-loads", "register-staging",
              "double-buffer", "interior-tiles", "block-swizzle", "cooperative-matrix",
              "wave-broadcast", "direct-store", "workgroup-matrix")


class HlslMatmul(CudaMatmul):
    """The (hlsl, matmul) entry: the GPU matmul's plans and rules, printed as HLSL."""

    backend = "hlsl"
    rules: Mapping[str, Rule] = {tid: RULES[tid] for tid in HLSL_STEPS}

    def lift(self, source: str, entry: str) -> Plan:
        return lift_seed(source, entry)

    def emit(self, plan: Plan, entry: str) -> str:
        return emit_shader(plan, entry)

    def launch(self, plan: Plan) -> dict[str, str]:
        return launch_of(plan)

    def owns(self, plan: Plan) -> bool:
        return plan.hlsl
