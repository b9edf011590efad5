"""Reference transformations of the C matmul: lift the seed into a loop-nest IR, rewrite
the IR as each transformation's text says, print it back as C."""

from __future__ import annotations

from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError

from ..change import ReferenceChange, check_declared
from .emit import emit_source, macros_used
from .ir import Nest, dump_nest, load_nest
from .lift import lift_seed
from .rules import RULES

__all__ = ["CMatmul", "Nest", "emit_source", "macros_used", "nest_of"]


def nest_of(context: KernelContext) -> Nest:
    """The nest of the seed (lifted from its source) or of one of our own variants."""
    if not context.state:
        if context.applied or context.lineage is not None:
            raise ApplyError("reference applier can only continue from the seed or its own "
                             "variants (this variant has no reference state)")
        return lift_seed(context.source, context.entry)
    try:
        nest = load_nest(context.state)
    except ApplyError as exc:
        raise ApplyError("reference applier can only continue from the seed or its own "
                         f"variants ({exc})") from exc
    if emit_source(nest, context.entry) != context.source:
        raise ApplyError("reference applier can only continue from the seed or its own "
                         "variants (the source was changed after the reference applier)")
    return nest


class CMatmul:
    """The (c, matmul) entry of the reference applier's registry."""

    backend = "c"
    kernel = "matmul"

    def implements(self, transform_id: str) -> bool:
        return transform_id in RULES

    def apply(
        self, context: KernelContext, transformation: Transformation, device: DeviceProfile
    ) -> ReferenceChange:
        """What the child differs in (code, state, ties); InvalidPoint if illegal."""
        tid = transformation.id
        rule = RULES.get(tid)
        if rule is None:
            raise ApplyError(f"reference applier has no c/matmul implementation of {tid!r}")
        change = rule(nest_of(context), device)
        check_declared(context, transformation, macros_used(change.nest))
        return ReferenceChange(emit_source(change.nest, context.entry), dump_nest(change.nest),
                               change.constraints)
