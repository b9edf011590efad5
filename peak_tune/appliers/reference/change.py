"""What a reference implementation returns (everything a child variant differs in), and
the checks every implementation makes on its state and its macros."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from peak_tune.catalog.types import Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError

__all__ = ["ReferenceChange", "check_declared", "read_state"]


@dataclass(frozen=True)
class ReferenceChange:
    """Code, applier state, parameter ties, size limits and (GPU) launch geometry.

    `launch` None keeps the parent's geometry (the C backend has none)."""

    source: str
    state: str
    constraints: tuple[str, ...] = ()
    size_constraints: tuple[str, ...] = ()
    launch: Mapping[str, str] | None = None


def check_declared(context: KernelContext, transformation: Transformation,
                   used: Iterable[str]) -> None:
    """ApplyError if the printed code uses a macro no transformation so far declares."""
    declared = {p.name for p in context.params + transformation.params}
    missing = [m for m in used if m not in declared]
    if missing:
        raise ApplyError(
            f"{transformation.id}: the reference implementation uses parameter(s) "
            f"{', '.join(missing)} that neither it nor an earlier transformation declares")


def read_state(text: str, format_tag: str) -> dict[str, Any]:
    """The JSON object of a reference state with the given format tag; ApplyError if
    the text is not one."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApplyError(f"reference applier state is not JSON: {exc.msg}") from exc
    if not isinstance(payload, dict) or payload.get("format") != format_tag:
        raise ApplyError("reference applier state has another format")
    return payload
