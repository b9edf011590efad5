"""Which sequences of transformations are legal: the one reading of the catalog's
`requires` and `conflicts` that the pipeline, the reference applier, the dry run and the
search's neighbours all use.

A step may follow the steps `done` when it is not among them, every step it requires is
among them, and none it conflicts with is (a conflict is about what came before: see
catalog.types.Transformation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peak_tune.catalog.types import Transformation
from peak_tune.errors import InvalidPoint

__all__ = ["check_sequence", "legal_next", "why_illegal"]


def why_illegal(done: Sequence[str], tid: str,
                transformations: Mapping[str, Transformation]) -> str:
    """Why `tid` may not follow `done`, in words ("" when it may)."""
    if tid in done:
        return f"{tid} applied twice"
    step = transformations[tid]
    missing = [r for r in step.requires if r not in done]
    if missing:
        return f"{tid} requires {', '.join(missing)} before it"
    clash = [c for c in step.conflicts if c in done]
    if clash:
        return f"{tid} conflicts with {', '.join(clash)}"
    return ""


def check_sequence(sequence: Sequence[str],
                   transformations: Mapping[str, Transformation]) -> None:
    """InvalidPoint naming the first step that may not follow the ones before it."""
    for index, tid in enumerate(sequence):
        problem = why_illegal(sequence[:index], tid, transformations)
        if problem:
            raise InvalidPoint(problem)


def legal_next(done: Sequence[str], transformations: Mapping[str, Transformation]
               ) -> list[str]:
    """The steps that may follow `done`, in id order."""
    return [tid for tid in sorted(transformations)
            if not why_illegal(done, tid, transformations)]
