"""What a reference implementation returns: everything a child variant differs in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ReferenceChange"]


@dataclass(frozen=True)
class ReferenceChange:
    """Code, applier state, parameter ties, size limits and (GPU) launch geometry.

    `launch` None keeps the parent's geometry (the C backend has none)."""

    source: str
    state: str
    constraints: tuple[str, ...] = ()
    size_constraints: tuple[str, ...] = ()
    launch: Mapping[str, str] | None = None
