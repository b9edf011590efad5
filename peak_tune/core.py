"""Values that cross the seams between catalogs, appliers, backends, search and cache.

Every value here is frozen; a KernelContext's content hash is its identity.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

__all__ = [
    "ArgSpec",
    "KernelContext",
    "KernelSpec",
    "Lineage",
    "Measurement",
    "Outcome",
    "ParamDomain",
    "ProblemSize",
    "Status",
    "VendorCall",
    "geometric_mean",
    "check_size_text",
    "size_of",
    "stable_hash",
    "vendor_call",
]


def stable_hash(payload: Any) -> str:
    """SHA-256 of a JSON-serialisable payload with sorted keys (hex, 64 chars)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Status(Enum):
    """How one evaluation ended. Only OK carries a timing."""

    OK = "ok"
    INVALID = "invalid"  # illegal sequence or tuning point: pruned, not an error
    APPLY_ERROR = "apply_error"  # the applier could not carry out a transformation
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "crash"  # the kernel crashed (signal, illegal address, ...)
    WRONG_RESULT = "wrong_result"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class ProblemSize:
    """Values of a kernel's problem-size symbols in the spec's order, e.g. M, N, K."""

    values: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, mapping: Mapping[str, int]) -> ProblemSize:
        return cls(tuple((k, int(v)) for k, v in mapping.items()))

    def as_dict(self) -> dict[str, int]:
        return dict(self.values)

    def label(self) -> str:
        return "x".join(str(v) for _, v in self.values)


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument: a buffer (shape in size symbols) or an integer scalar."""

    name: str
    kind: str  # "buffer" | "scalar"
    shape: tuple[str, ...] = ()  # expressions in the size symbols (buffers)
    intent: str = "in"  # "in" | "out" | "inout" (buffers)
    # initialiser for inputs: "uniform" (signed, magnitudes spread over binary orders:
    # peak_tune.harness.values) | "normal" | "zeros" | "ones"
    init: str = "uniform"
    value: str = ""  # expression in the size symbols (scalars)


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel computes, independent of backend (seeds/<kernel>/spec.toml)."""

    name: str
    description: str
    size_symbols: tuple[str, ...]
    default_size: ProblemSize
    args: tuple[ArgSpec, ...]
    flops: str  # expression in the size symbols
    min_bytes: str  # expression in the size symbols and `elem` (bytes per element)
    reference: str  # numpy expression over the input buffers, run in float64
    error_scale: str  # numpy expression: per-element magnitude the tolerance scales with
    tolerances: Mapping[str, float]  # dtype -> relative tolerance against error_scale
    dtypes: tuple[str, ...]
    sources: Mapping[str, str]  # backend -> seed source text
    entry: Mapping[str, str]  # backend -> entry-point name
    check_sizes: tuple[ProblemSize, ...] = ()  # validated too: multiples of no tile
    # backend -> launch expressions in the size symbols (GPU: grid_x, block_x, shared_bytes...)
    launch: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    folder: str = ""  # where it was loaded from (for messages)
    # side -> input the reference is linear in: "right" = "B" means ref(B := B @ v) is
    # ref @ v for a vector v over the output's last axis, "left" = "A" that ref(A := u @ A)
    # is u @ ref over its second-to-last; timed runs are then checked by projections
    projection: Mapping[str, str] = field(default_factory=dict)
    # backend -> the vendor baseline's call ([vendor] in spec.toml; see VendorCall)
    vendor: Mapping[str, str] = field(default_factory=dict)


class VendorCall(StrEnum):
    """What a backend times as the vendor baseline of a kernel ([vendor] in spec.toml)."""

    GEMM = "gemm"  # C = A @ B by the backend's BLAS (batched when all three share a batch)
    GEMM_BT = "gemm-bt"  # C = A @ B^T, B stored N x K
    REFERENCE = "reference"  # numpy evaluates the spec's reference expression (the CPU)
    NONE = "none"  # no library: the ratio is to the device's peak or bandwidth roofline


def vendor_call(spec: KernelSpec, backend: str) -> VendorCall:
    """The spec's vendor call for `backend`; undeclared: numpy on the reference expression
    on the CPU, none on a GPU (there is no library call for an arbitrary expression)."""
    declared = spec.vendor.get(backend)
    if declared is not None:
        return VendorCall(declared)
    return VendorCall.REFERENCE if backend == "c" else VendorCall.NONE


@dataclass(frozen=True)
class ParamDomain:
    """A tuning parameter: a preprocessor macro with its allowed values."""

    name: str
    values: tuple[int, ...]
    introduced_by: str = ""  # transformation id


@dataclass(frozen=True)
class Lineage:
    parent_hash: str
    transform_id: str
    transform_version: int
    transform_text_hash: str
    applier: str  # applier identity, e.g. "reference/1" or "llm/gpt-4o-mini@0.2"


@dataclass(frozen=True)
class KernelContext:
    """One kernel variant.

    `source` holds the kernel with tuning parameters as macros; `constraints` are
    expressions over parameters that must hold (else the point is invalid);
    `size_constraints` are expressions over sizes and parameters the variant needs
    (e.g. "M % MR == 0"): a variant that declares them is only run on sizes meeting them.
    `applied` lists the transformation ids applied so far, in order. `state` is private
    to the applier that produced the variant (the reference applier keeps its loop-nest
    description there); it is part of the identity.
    """

    kernel: str
    backend: str
    source: str
    entry: str
    params: tuple[ParamDomain, ...] = ()
    constraints: tuple[str, ...] = ()
    size_constraints: tuple[str, ...] = ()
    applied: tuple[str, ...] = ()
    launch: Mapping[str, str] = field(default_factory=dict)  # grid/block/shared (GPU)
    state: str = ""
    lineage: Lineage | None = None

    def identity(self) -> dict[str, Any]:
        """Everything that decides what the variant computes and how fast."""
        return {
            "kernel": self.kernel,
            "backend": self.backend,
            "source": self.source,
            "entry": self.entry,
            "params": [[p.name, list(p.values)] for p in self.params],
            "constraints": list(self.constraints),
            "size_constraints": list(self.size_constraints),
            "launch": dict(sorted(self.launch.items())),
            "state": self.state,
        }

    def content_hash(self) -> str:
        return stable_hash(self.identity())

    def build_identity(self) -> dict[str, str]:
        """What a compiler sees of the variant. Builds are keyed by this (with the macros
        and flags) rather than by the whole identity: sequences that print the same source
        share one build (2-13% of the builds of the recorded CUDA landscapes:
        benchmarks/build_sharing.py)."""
        return {"source": self.source, "entry": self.entry}

    def run_identity(self) -> dict[str, Any]:
        """What decides how the variant runs: its build, launch geometry and the sizes it
        runs at. Evaluations are keyed by this: a variant that prints the same kernel as
        one already measured (another order of commuting steps) is not timed again."""
        return {"backend": self.backend, **self.build_identity(),
                "launch": dict(sorted(self.launch.items())),
                "size_constraints": list(self.size_constraints)}

    def param(self, name: str) -> ParamDomain | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class Measurement:
    """Timing of one kernel at one problem size. Raw samples kept; round only to print."""

    samples_ms: tuple[float, ...]
    flops: float

    @property
    def median_ms(self) -> float:
        ordered = sorted(self.samples_ms)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        return (ordered[mid - 1] + ordered[mid]) / 2

    @property
    def spread(self) -> float:
        """(max - min) / median of the samples."""
        return (max(self.samples_ms) - min(self.samples_ms)) / self.median_ms

    @property
    def gflops(self) -> float:
        return self.flops / (self.median_ms * 1e-3) / 1e9


@dataclass(frozen=True)
class Outcome:
    """Result of evaluating one variant with one set of parameter values."""

    status: Status
    measurement: Measurement | None = None
    message: str = ""  # one line for people; the log goes in `detail`
    detail: str = ""
    cached: bool = False
    transient: bool = False  # true of this run only (a build budget): never cached
    # the timing's spread stayed past the threshold after re-measuring
    # (peak_tune.harness.noise): shown as noisy, never cached as final
    noisy: bool = False
    remeasured: int = 0  # timings after the first (a noisy first timing is measured again)

    @property
    def gflops(self) -> float:
        return self.measurement.gflops if self.measurement else 0.0


_POSITIONAL = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*)*")
_NAMED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[1-9][0-9]*(,[A-Za-z_][A-Za-z0-9_]*=[1-9][0-9]*)*")


def check_size_text(text: str) -> str:
    """`text` if it is a size: "N", "AxBx..." or "NAME=V,NAME=V,..." with positive
    integers (which names it needs is the kernel's: see size_of); else ValueError."""
    text = text.strip()
    if _POSITIONAL.fullmatch(text.lower()) or _NAMED.fullmatch(text.replace(" ", "")):
        return text
    raise ValueError(f"size {text!r}: use N, AxBx... (in the kernel's order) or "
                     f"NAME=V,NAME=V,... with positive integers")


def size_of(text: str, symbols: tuple[str, ...]) -> dict[str, int]:
    """A size for a kernel whose size symbols are `symbols`: "N" gives every symbol N;
    "AxBx..." one value per symbol in the spec's order; "NAME=V,..." names every
    symbol. ValueError saying what this kernel's sizes look like."""
    text = check_size_text(text)
    shape = "x".join(symbols)
    if "=" in text:
        pairs = dict(part.split("=") for part in text.replace(" ", "").split(","))
        if set(pairs) != set(symbols):
            raise ValueError(f"size {text!r} names {', '.join(sorted(pairs))}; this kernel's "
                             f"sizes are {', '.join(symbols)}")
        return {s: int(pairs[s]) for s in symbols}
    values = [int(v) for v in text.lower().split("x")]
    if len(values) == 1:
        values *= len(symbols)
    if len(values) != len(symbols):
        raise ValueError(f"size {text!r} gives {len(values)} values; this kernel's sizes "
                         f"are {shape} (or N, or {'=..,'.join(symbols)}=..)")
    return dict(zip(symbols, values, strict=True))


def geometric_mean(values: list[float]) -> float:
    """Of positive values; 0.0 for none, or where one is not positive (a failed size)."""
    if not values or min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))
