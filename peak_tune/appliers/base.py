"""The Applier seam: carries out one natural transformation on one kernel variant."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext, Lineage, ParamDomain

__all__ = ["Applier", "Budgeted", "ModelCalls", "budget_spent_of", "calls_of", "derive_child"]


class Applier(Protocol):
    """Turns a parent variant into a child variant by following a transformation's text.

    The child declares the transformation's tuning parameters as macros (their values
    are chosen by the tuner, never by the applier) and carries lineage to the parent.
    Raises InvalidPoint when the transformation cannot legally apply to this parent
    (a precondition on the kernel's state), ApplyError when it should apply but the
    applier failed. Never returns the parent unchanged as if it had applied.
    """

    @property
    def identity(self) -> str:
        """Name and version, part of the application cache key (e.g. "reference/1")."""
        ...

    def apply(
        self,
        context: KernelContext,
        transformation: Transformation,
        device: DeviceProfile,
        sample: int = 0,
    ) -> KernelContext: ...


@runtime_checkable
class ModelCalls(Protocol):
    """An applier that calls a model keeps a record of each HTTP attempt (the LLM
    applier's CallRecord: tokens, outcome, transformation): the journal, the summary's
    spend and `peak-tune stats` read it. The session also asks it how many requests it
    keeps in flight, has it journal the ones a stop left waiting, and tells it what the
    study's earlier runs spent (--budget-scope study)."""

    @property
    def records(self) -> list[Any]: ...

    @property
    def concurrency(self) -> int:
        """Requests in flight at once: the applications worth running together."""
        ...

    def abandon_in_flight(self) -> int:
        """Record the calls still waiting for a reply as interrupted; how many."""
        ...

    def count_earlier(self, earlier: Any) -> None:
        """Let the budget count these earlier calls (an appliers.llm Usage) too."""
        ...


def calls_of(applier: Applier) -> list[Any] | None:
    """The applier's call records, or None for one that calls no model."""
    return applier.records if isinstance(applier, ModelCalls) else None


@runtime_checkable
class Budgeted(Protocol):
    """An applier with a token or cost budget (the LLM applier's --max-tokens-total,
    --max-cost)."""

    def budget_spent(self) -> str:
        """Why the budget is spent, in words; "" while some is left."""
        ...


def budget_spent_of(applier: Applier) -> str:
    return applier.budget_spent() if isinstance(applier, Budgeted) else ""


def derive_child(
    parent: KernelContext,
    transformation: Transformation,
    applier_identity: str,
    *,
    source: str,
    state: str = "",
    constraints: tuple[str, ...] = (),
    size_constraints: tuple[str, ...] = (),
    launch: dict[str, str] | None = None,
) -> KernelContext:
    """The child variant of `parent` after `transformation`: new code, the
    transformation's parameters and constraints added, lineage pointing at the parent.

    `constraints` and `size_constraints` are extra ones the applier found (e.g. ones
    that tie this transformation's parameters to earlier ones); duplicates are dropped.
    """
    known = {p.name for p in parent.params}
    added = tuple(
        ParamDomain(p.name, p.values, transformation.id)
        for p in transformation.params
        if p.name not in known
    )
    return replace(
        parent,
        source=source,
        state=state,
        params=parent.params + added,
        constraints=_merged(parent.constraints, transformation.constraints + constraints),
        size_constraints=_merged(parent.size_constraints, size_constraints),
        applied=parent.applied + (transformation.id,),
        launch=dict(parent.launch if launch is None else launch),
        lineage=Lineage(
            parent_hash=parent.content_hash(),
            transform_id=transformation.id,
            transform_version=transformation.version,
            transform_text_hash=transformation.text_hash(),
            applier=applier_identity,
        ),
    )


def _merged(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    return old + tuple(c for i, c in enumerate(new) if c not in old and c not in new[:i])
