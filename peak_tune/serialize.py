"""JSON forms of the values that are stored: contexts and outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peak_tune.core import KernelContext, Lineage, Measurement, Outcome, ParamDomain, Status

__all__ = ["context_from_json", "context_to_json", "kernel_header", "outcome_from_json",
           "outcome_to_json"]


def context_to_json(context: KernelContext) -> dict[str, Any]:
    data = context.identity()
    data["params"] = [[p.name, list(p.values), p.introduced_by] for p in context.params]
    data["applied"] = list(context.applied)
    data["lineage"] = vars(context.lineage) if context.lineage else None
    return data


def context_from_json(data: dict[str, Any]) -> KernelContext:
    lineage = data.get("lineage")
    return KernelContext(
        kernel=data["kernel"],
        backend=data["backend"],
        source=data["source"],
        entry=data["entry"],
        params=tuple(ParamDomain(n, tuple(v), by) for n, v, by in data["params"]),
        constraints=tuple(data["constraints"]),
        size_constraints=tuple(data["size_constraints"]),
        applied=tuple(data["applied"]),
        launch=dict(data["launch"]),
        state=data["state"],
        lineage=Lineage(**lineage) if lineage else None,
    )


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    m = outcome.measurement
    return {
        "status": outcome.status.value,
        "samples_ms": list(m.samples_ms) if m else None,
        "flops": m.flops if m else None,
        "message": outcome.message,
        "detail": outcome.detail,
    }


def outcome_from_json(data: dict[str, Any], cached: bool = False) -> Outcome:
    measurement = None
    if data.get("samples_ms"):
        measurement = Measurement(tuple(data["samples_ms"]), float(data["flops"]))
    return Outcome(
        status=Status(data["status"]),
        measurement=measurement,
        message=data.get("message", ""),
        detail=data.get("detail", ""),
        cached=cached,
    )


def kernel_header(lines: list[str], context: KernelContext, params: Mapping[str, int | str]
                  ) -> str:
    """A comment block saying where a kernel comes from, then its tuning values (and the
    element type's macros) as macros that -DNAME=VALUE can still override."""
    lines = [*lines, "tuning parameters are set below; override them with -DNAME=VALUE"]
    if context.size_constraints:
        lines.append(f"requires sizes with: {', '.join(context.size_constraints)}")
    header = "/*\n" + "".join(f" * {line}\n" for line in lines) + " */\n"
    return header + "".join(f"#ifndef {k}\n#define {k} {v}\n#endif\n" for k, v in params.items())
