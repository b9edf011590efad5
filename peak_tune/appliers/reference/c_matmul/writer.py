"""Small pieces shared by the C emitters: an indenting line writer and the scope record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..code_writer import CodeWriter
from .ir import Nest

__all__ = ["CodeWriter", "Scope", "group", "omp_for"]


@dataclass(frozen=True)
class Scope:
    """What the code at one point of the nest can refer to.

    `bounds` maps each dimension to the C expressions of its current range (lo, hi);
    `first` is "1" or the name of the flag saying this visit is the first over K for
    the elements being written; `out` names the array written ("C", or "Ct" under a
    K split); `depth` counts the nest loops already opened.
    """

    nest: Nest
    bounds: Mapping[str, tuple[str, str]]
    first: str = "1"
    out: str = "C"
    depth: int = 0

    def lo(self, dim: str) -> str:
        return self.bounds[dim][0]

    def hi(self, dim: str) -> str:
        return self.bounds[dim][1]

    def narrowed(self, dim: str, lo: str, hi: str) -> Scope:
        bounds = dict(self.bounds)
        bounds[dim] = (lo, hi)
        return replace(self, bounds=bounds)

    def deeper(self) -> Scope:
        return replace(self, depth=self.depth + 1)

    def outside_parallel(self) -> bool:
        """True when the nest is parallel and its parallel loop has not been opened yet:
        helper loops here (packing, zeroing) get their own `omp parallel for`."""
        index = self.nest.parallel_index()
        return index is not None and index >= self.depth

    @property
    def restrict(self) -> str:
        return "restrict " if self.nest.restrict else ""


def omp_for(writer: CodeWriter, scope: Scope) -> None:
    """Share a helper loop among threads when it runs outside the parallel loop."""
    if scope.outside_parallel():
        writer.pragma("omp parallel for schedule(static)")


def group(expression: str) -> str:
    """`expression` in parentheses unless it is a single name or number."""
    return expression if expression.replace("_", "").isalnum() else f"({expression})"
