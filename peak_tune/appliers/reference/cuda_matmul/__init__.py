"""Reference transformations of the GPU matmul: lift the naive seed, rewrite a kernel
plan (plan.py) as each transformation's text says, print it back as CUDA C++ or HIP
(dialect.py: one plan, either dialect) together with its launch geometry.

Unlike the C kernel, a CUDA child also changes KernelContext.launch (grid, block,
dynamic shared memory) and may declare size constraints: `CudaMatmul.apply` returns all
of it as a ReferenceChange, which the reference applier turns into the child context.
"""

from __future__ import annotations

from collections.abc import Mapping

from peak_tune.appliers.base import derive_child
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError, InvalidPoint

from ..change import ReferenceChange, check_declared
from .emit import emit_source
from .geometry import launch_of, macros_used
from .lift import lift_seed
from .plan import NAIVE, NAIVE_HIP, Plan, dump_plan, load_plan, structure_problem
from .rules import RULES, Rule

__all__ = ["CudaChange", "CudaMatmul", "HipMatmul", "Plan", "apply_transformation",
           "emit_source", "launch_of", "macros_used", "plan_of"]

IDENTITY = "reference/1"  # the reference applier's identity (reference/__init__.py)
_FOREIGN = "reference applier can only continue from the seed or its own variants"


CudaChange = ReferenceChange  # the name the tests know


def plan_of(context: KernelContext) -> Plan:
    """The plan of the seed (lifted from its source) or of one of our own variants."""
    return _IMPLEMENTATIONS.get(context.backend, CudaMatmul()).plan_of(context)


class CudaMatmul:
    """The (cuda, matmul) entry of the reference applier's registry. Its dialect hooks
    (lift, emit, launch, owns) are what HipMatmul and HlslMatmul change."""

    backend = "cuda"
    kernel = "matmul"
    rules: Mapping[str, Rule] = RULES

    def implements(self, transform_id: str) -> bool:
        return transform_id in self.rules

    # ------------------------------------------------------------ dialect hooks

    def lift(self, source: str, entry: str) -> Plan:
        lift_seed(source, entry)
        return NAIVE

    def emit(self, plan: Plan, entry: str) -> str:
        return emit_source(plan, entry)

    def launch(self, plan: Plan) -> dict[str, str]:
        return launch_of(plan)

    def owns(self, plan: Plan) -> bool:
        """Whether the plan is printed in this entry's dialect."""
        return not plan.hip and not plan.hlsl

    # ------------------------------------------------------------ transformations

    def plan_of(self, context: KernelContext) -> Plan:
        """The plan of the seed (lifted from its source) or of one of our own variants."""
        if not context.state:
            if context.applied or context.lineage is not None:
                raise ApplyError(f"{_FOREIGN} (this variant has no reference state)")
            return self.lift(context.source, context.entry)
        try:
            plan = load_plan(context.state)
        except ApplyError as exc:
            raise ApplyError(f"{_FOREIGN} ({exc})") from exc
        if not self.owns(plan):
            raise ApplyError(f"{_FOREIGN} (its plan is for another dialect)")
        if self.emit(plan, context.entry) != context.source:
            raise ApplyError(f"{_FOREIGN} (the source was changed after the reference applier)")
        if dict(context.launch) != self.launch(plan):
            raise ApplyError(f"{_FOREIGN} (the launch was changed after the reference applier)")
        return plan

    def derive(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> ReferenceChange:
        """The child's code, state, constraints and launch; InvalidPoint if illegal."""
        tid = transformation.id
        rule = self.rules.get(tid)
        if rule is None:
            raise ApplyError(f"reference applier has no {self.backend}/matmul implementation "
                             f"of {tid!r}")
        change = rule(self.plan_of(context), device)
        problem = structure_problem(change.plan)
        if problem:  # a step that cannot follow an earlier one (e.g. ldmatrix after wgmma)
            raise InvalidPoint(f"{tid}: {problem}")
        check_declared(context, transformation, macros_used(change.plan))
        return ReferenceChange(
            source=self.emit(change.plan, context.entry),
            state=dump_plan(change.plan),
            constraints=change.constraints,
            size_constraints=change.size_constraints,
            launch=self.launch(change.plan),
        )

    def apply(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> ReferenceChange:
        """The ReferenceKernel protocol (the registry's entry point)."""
        return self.derive(context, transformation, device)


class HipMatmul(CudaMatmul):
    """The (hip, matmul) entry: the same plans and rules, printed as HIP."""

    backend = "hip"

    def lift(self, source: str, entry: str) -> Plan:
        lift_seed(source, entry)
        return NAIVE_HIP

    def owns(self, plan: Plan) -> bool:
        return plan.hip


_IMPLEMENTATIONS: dict[str, CudaMatmul] = {"cuda": CudaMatmul(), "hip": HipMatmul()}


def apply_transformation(
    context: KernelContext, transformation: Transformation, device: DeviceProfile
) -> KernelContext:
    """The child context after `transformation` (what the reference applier returns)."""
    from peak_tune.appliers.reference import check_sequence  # the registry imports us

    if context.kernel != "matmul" or context.backend not in _IMPLEMENTATIONS:
        raise ApplyError(f"the GPU matmul reference cannot apply to "
                         f"{context.backend}/{context.kernel}")
    check_sequence(context, transformation)
    implementation = _IMPLEMENTATIONS[context.backend]
    change = implementation.derive(context, transformation, device)
    return derive_child(
        context, transformation, IDENTITY, source=change.source, state=change.state,
        constraints=change.constraints, size_constraints=change.size_constraints,
        launch=dict(change.launch or {}),
    )
