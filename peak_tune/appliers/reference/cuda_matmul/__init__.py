"""Reference transformations of the CUDA matmul: lift the naive seed, rewrite a kernel
plan (plan.py) as each transformation's text says, print it back as CUDA C++ together
with its launch geometry.

Unlike the C kernel, a CUDA child also changes KernelContext.launch (grid, block,
dynamic shared memory) and may declare size constraints. `CudaMatmul.derive` returns
all of it (a CudaChange); `apply_transformation` builds the child context from it with
derive_child. The registry's ReferenceKernel protocol (reference/__init__.py) returns
source, state and constraints only, so `CudaMatmul.apply` refuses (ApplyError) any
change it could not carry instead of dropping the launch silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peak_tune.appliers.base import derive_child
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError

from .emit import emit_source
from .geometry import launch_of, macros_used
from .lift import lift_seed
from .plan import Plan, dump_plan, load_plan
from .rules import RULES

__all__ = ["CudaChange", "CudaMatmul", "Plan", "apply_transformation", "emit_source",
           "launch_of", "macros_used", "plan_of"]

IDENTITY = "reference/1"  # the reference applier's identity (reference/__init__.py)
_FOREIGN = "reference applier can only continue from the seed or its own variants"


@dataclass(frozen=True)
class CudaChange:
    """Everything a CUDA child differs in: code, state, ties, size limits, geometry."""

    source: str
    state: str
    constraints: tuple[str, ...] = ()
    size_constraints: tuple[str, ...] = ()
    launch: Mapping[str, str] = field(default_factory=dict)


def plan_of(context: KernelContext) -> Plan:
    """The plan of the seed (lifted from its source) or of one of our own variants."""
    if not context.state:
        if context.applied or context.lineage is not None:
            raise ApplyError(f"{_FOREIGN} (this variant has no reference state)")
        return lift_seed(context.source, context.entry)
    try:
        plan = load_plan(context.state)
    except ApplyError as exc:
        raise ApplyError(f"{_FOREIGN} ({exc})") from exc
    if emit_source(plan, context.entry) != context.source:
        raise ApplyError(f"{_FOREIGN} (the source was changed after the reference applier)")
    if dict(context.launch) != launch_of(plan):
        raise ApplyError(f"{_FOREIGN} (the launch was changed after the reference applier)")
    return plan


class CudaMatmul:
    """The (cuda, matmul) entry of the reference applier's registry."""

    backend = "cuda"
    kernel = "matmul"

    def implements(self, transform_id: str) -> bool:
        return transform_id in RULES

    def derive(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> CudaChange:
        """The child's code, state, constraints and launch; InvalidPoint if illegal."""
        tid = transformation.id
        rule = RULES.get(tid)
        if rule is None:
            raise ApplyError(f"reference applier has no cuda/matmul implementation of {tid!r}")
        change = rule(plan_of(context), device)
        declared = {p.name for p in context.params + transformation.params}
        missing = [m for m in macros_used(change.plan) if m not in declared]
        if missing:
            raise ApplyError(
                f"{tid}: the reference implementation uses parameter(s) {', '.join(missing)} "
                "that neither it nor an earlier transformation declares")
        return CudaChange(
            source=emit_source(change.plan, context.entry),
            state=dump_plan(change.plan),
            constraints=change.constraints,
            size_constraints=change.size_constraints,
            launch=launch_of(change.plan),
        )

    def apply(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> tuple[str, str, tuple[str, ...]]:
        """The ReferenceKernel protocol: (source, state, constraints) of the child.

        ApplyError when the child also needs a new launch geometry or size constraints,
        which that protocol cannot carry (see the module docstring).
        """
        change = self.derive(context, transformation, device)
        if dict(change.launch) != dict(context.launch) or change.size_constraints:
            raise ApplyError(
                f"{transformation.id}: the CUDA child changes the launch geometry or size "
                "constraints, which ReferenceKernel.apply cannot return; the reference "
                "applier must take CudaMatmul.derive's CudaChange")
        return change.source, change.state, change.constraints


def apply_transformation(
    context: KernelContext, transformation: Transformation, device: DeviceProfile
) -> KernelContext:
    """The child context after `transformation` (what the reference applier returns)."""
    from peak_tune.appliers.reference import check_sequence  # the registry imports us

    if (context.backend, context.kernel) != ("cuda", "matmul"):
        raise ApplyError(f"the CUDA matmul reference cannot apply to "
                         f"{context.backend}/{context.kernel}")
    check_sequence(context, transformation)
    change = CudaMatmul().derive(context, transformation, device)
    return derive_child(
        context, transformation, IDENTITY, source=change.source, state=change.state,
        constraints=change.constraints, size_constraints=change.size_constraints,
        launch=dict(change.launch),
    )
