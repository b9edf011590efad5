"""What backends send to their worker processes and read back, shared by all of them:
timing settings, the tuning macros as compiler flags, kernel specs, the kinds of typed
errors a reply can carry, and measurements from replies."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from peak_tune.backends.base import EvalConfig
from peak_tune.core import ArgSpec, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import (
    CompileError,
    InvalidPoint,
    KernelCrash,
    KernelTimeout,
    NoVendorLibrary,
    UserError,
    WrongResult,
)
from peak_tune.expr import evaluate

__all__ = ["ERROR_KINDS", "MIN_REPEATS", "Timing", "config_to_wire", "macro_flags",
           "measurement_from_reply", "spec_from_wire", "spec_to_wire"]

MIN_REPEATS = 3
# the typed errors a worker's reply can carry, by the name it travels under
ERROR_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("wrong_result", WrongResult),
    ("timeout", KernelTimeout),
    ("crash", KernelCrash),
    ("compile", CompileError),
    ("invalid", InvalidPoint),
    ("no_vendor", NoVendorLibrary),  # before "user": it is one
    ("user", UserError),
)
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def config_to_wire(config: EvalConfig) -> dict[str, Any]:
    return {
        "warmup": config.warmup,
        "repeats": config.repeats,
        "max_timing_s": config.max_timing_s,
        "slow_cutoff_ms": config.slow_cutoff_ms,
        "validation_seed": config.validation_seed,
    }


@dataclass(frozen=True)
class Timing:
    """EvalConfig's timing fields as a worker receives them (config_to_wire)."""

    warmup: int
    repeats: int
    max_timing_s: float
    slow_cutoff_ms: float
    seed: int

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Timing:
        return cls(int(config["warmup"]), int(config["repeats"]), float(config["max_timing_s"]),
                   float(config["slow_cutoff_ms"]), int(config["validation_seed"]))

    def repeat_count(self, one_run_ms: float) -> int:
        """`repeats`, or fewer (at least 3) when they would take over max_timing_s; a
        single run for a kernel slower than slow_cutoff_ms (when set)."""
        if 0 < self.slow_cutoff_ms < one_run_ms:
            return 1
        if one_run_ms * self.repeats <= self.max_timing_s * 1e3 or self.repeats <= MIN_REPEATS:
            return self.repeats
        return max(MIN_REPEATS, int(self.max_timing_s * 1e3 / max(one_run_ms, 1e-6)))


def measurement_from_reply(spec: KernelSpec, size: ProblemSize,
                           reply: Mapping[str, Any]) -> Measurement:
    flops = float(evaluate(spec.flops, size.as_dict()))
    return Measurement(tuple(float(s) for s in reply["samples_ms"]), flops)


def macro_flags(params: Mapping[str, int], reserved: Collection[str]) -> list[str]:
    """`-DNAME=VALUE` for each tuning parameter; CompileError for a bad name or value."""
    flags = []
    for name, value in sorted(params.items()):
        if not _MACRO_NAME.match(name) or name in reserved:
            raise CompileError(f"compile error: {name!r} cannot be a tuning parameter name")
        if isinstance(value, bool) or not isinstance(value, int):
            raise CompileError(f"compile error: tuning parameter {name} = {value!r} "
                               "is not an integer")
        flags.append(f"-D{name}={value}")
    return flags


def spec_to_wire(spec: KernelSpec) -> dict[str, Any]:
    """What a worker needs of a KernelSpec, as JSON (sources are left out)."""
    return {
        "name": spec.name,
        "description": spec.description,
        "size_symbols": list(spec.size_symbols),
        "default_size": spec.default_size.as_dict(),
        "args": [
            {"name": a.name, "kind": a.kind, "shape": list(a.shape), "intent": a.intent,
             "init": a.init, "value": a.value}
            for a in spec.args
        ],
        "flops": spec.flops,
        "min_bytes": spec.min_bytes,
        "reference": spec.reference,
        "error_scale": spec.error_scale,
        "tolerances": dict(spec.tolerances),
        "dtypes": list(spec.dtypes),
        "entry": dict(spec.entry),
        "check_sizes": [s.as_dict() for s in spec.check_sizes],
        "folder": spec.folder,
        "projection": dict(spec.projection),
        "vendor": dict(spec.vendor),
    }


def spec_from_wire(data: Mapping[str, Any]) -> KernelSpec:
    args = tuple(
        ArgSpec(name=a["name"], kind=a["kind"], shape=tuple(a["shape"]), intent=a["intent"],
                init=a["init"], value=a["value"])
        for a in data["args"]
    )
    return KernelSpec(
        name=data["name"],
        description=data["description"],
        size_symbols=tuple(data["size_symbols"]),
        default_size=ProblemSize.of(data["default_size"]),
        args=args,
        flops=data["flops"],
        min_bytes=data["min_bytes"],
        reference=data["reference"],
        error_scale=data["error_scale"],
        tolerances=dict(data["tolerances"]),
        dtypes=tuple(data["dtypes"]),
        sources={},
        entry=dict(data["entry"]),
        check_sizes=tuple(ProblemSize.of(s) for s in data["check_sizes"]),
        folder=data["folder"],
        projection=dict(data.get("projection", {})),
        vendor=dict(data.get("vendor", {})),
    )
