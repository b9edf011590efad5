"""The reference applier: deterministic, offline, genuine code transformations.

Each (backend, kernel) pair has an implementation that keeps its own description of the
kernel (for the C matmul, a loop-nest IR in KernelContext.state), rewrites it as a
transformation's text says and prints the result. Transformations compose in any order
their preconditions allow; nothing returns a pre-written kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from peak_tune.appliers.base import derive_child
from peak_tune.catalog.sequences import why_illegal
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError, InvalidPoint

from .c_matmul import CMatmul
from .change import ReferenceChange
from .cuda_matmul import CudaMatmul, HipMatmul
from .hlsl_matmul import HlslMatmul

__all__ = ["IMPLEMENTATIONS", "ReferenceApplier", "ReferenceChange", "ReferenceKernel"]

IDENTITY = "reference/1"


class ReferenceKernel(Protocol):
    """The reference transformations of one kernel on one backend."""

    def implements(self, transform_id: str) -> bool: ...

    def apply(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> ReferenceChange:
        """What the child differs in; InvalidPoint when illegal."""
        ...


IMPLEMENTATIONS: Mapping[tuple[str, str], ReferenceKernel] = {
    ("c", "matmul"): CMatmul(),
    ("cuda", "matmul"): CudaMatmul(),
    ("hip", "matmul"): HipMatmul(),
    ("hlsl", "matmul"): HlslMatmul(),
}


class ReferenceApplier:
    """Applier carrying out transformations with built-in implementations."""

    def __init__(
        self, implementations: Mapping[tuple[str, str], ReferenceKernel] = IMPLEMENTATIONS
    ) -> None:
        self._implementations = implementations

    @property
    def identity(self) -> str:
        return IDENTITY

    def implements(self, backend: str, kernel: str, transform_id: str) -> bool:
        found = self._implementations.get((backend, kernel))
        return found is not None and found.implements(transform_id)

    def apply(
        self,
        context: KernelContext,
        transformation: Transformation,
        device: DeviceProfile,
        sample: int = 0,
    ) -> KernelContext:
        """The child of `context` after `transformation` (the same for every sample)."""
        key = (context.backend, context.kernel)
        implementation = self._implementations.get(key)
        if implementation is None:
            raise ApplyError(
                f"reference applier has no implementation for backend {key[0]!r}, "
                f"kernel {key[1]!r} (transformation {transformation.id!r})"
            )
        if not implementation.implements(transformation.id):
            raise ApplyError(
                f"reference applier has no implementation of {transformation.id!r} "
                f"for {key[0]}/{key[1]}"
            )
        check_sequence(context, transformation)
        change = implementation.apply(context, transformation, device)
        return derive_child(
            context, transformation, IDENTITY, source=change.source, state=change.state,
            constraints=change.constraints, size_constraints=change.size_constraints,
            launch=None if change.launch is None else dict(change.launch),
        )


def check_sequence(context: KernelContext, transformation: Transformation) -> None:
    """InvalidPoint unless the transformation may follow what was applied so far."""
    tid = transformation.id
    if not transformation.applies_to(context.kernel, context.backend):
        raise InvalidPoint(f"{tid} is not for {context.backend}/{context.kernel}")
    problem = why_illegal(context.applied, tid, {tid: transformation})
    if problem:
        raise InvalidPoint(problem)
