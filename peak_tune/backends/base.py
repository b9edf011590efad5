"""The Backend seam: compile, validate and time variants; time the vendor baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize

__all__ = ["BUILD_BUDGET", "BUILD_BUDGET_AFTER", "BUILD_BUDGET_FLOOR_S", "OVER_BUDGET",
           "Artifact", "Backend", "Capabilities", "EvalConfig", "EvalRequest",
           "over_budget_message"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend is and offers, declared instead of tested by name or probed.

    `on_host`: kernels are timed on this machine's CPU (a study of it runs alone, builds
    one at a time, and on Ray builds where it times). `host_code`: kernels are host code
    that can fork and reach the worker's memory, so their runs are judged in another
    process (peak_tune.harness.host_judge); GPU kernels cannot, and are judged on the
    device. `launch_region`: variants have a launch region (grid, block) an applier may
    edit. `sanitizer`, `profiler`: the backend has `sanitize` and `profile`.
    `tensor_maps`: it encodes TMA tensor maps for the kernels that ask. `vendor_library`:
    `time_vendor` times a library for a kernel that declares one (else it raises
    NoVendorLibrary and the ratio is to the device's roofline). `bounded_buffers`: a
    kernel's reads and writes past a buffer stay inside it (Vulkan's robust buffer
    access), so there is no guard region to write into; elsewhere a write into the
    guards is an OutOfBounds wrong result."""

    on_host: bool
    host_code: bool
    launch_region: bool
    sanitizer: bool = False
    profiler: bool = False
    tensor_maps: bool = False
    vendor_library: bool = True
    bounded_buffers: bool = False


@dataclass(frozen=True)
class EvalConfig:
    """How hard to check and time. Timeouts are per evaluation (validation + timing)."""

    timeout_s: float = 60.0
    warmup: int = 1
    repeats: int = 7  # timed runs; the median is reported
    max_timing_s: float = 3.0  # fewer repeats (at least 3) for kernels slower than this allows
    # A kernel whose first run takes longer than this is clearly not competitive: it is
    # timed once instead of `repeats` times (0: off). The search sets it from the best.
    slow_cutoff_ms: float = 0.0
    # Offset of the first validation seed from the harness's secret seeds (never the
    # seed itself: a kernel must not know its inputs in advance).
    validation_seed: int = 0


@dataclass(frozen=True)
class Artifact:
    """A compiled variant: where it lies and what the compiler said about it."""

    path: str
    compile_key: str
    log: str = ""
    reused: bool = False  # an identical build was already on disk: no compiler run
    resources: Mapping[str, int] = field(default_factory=dict)  # registers, shared memory, ...


@dataclass(frozen=True)
class EvalRequest:
    """Validate then time one compiled variant.

    `check_sizes` are validated (fresh random inputs, poisoned outputs, guard regions,
    inputs unchanged, float64 reference); `size` is validated, timed, and its output
    checked again after the timed runs.
    """

    spec: KernelSpec
    context: KernelContext
    params: Mapping[str, int]
    dtype: str
    size: ProblemSize
    check_sizes: tuple[ProblemSize, ...]
    config: EvalConfig


# The build budget (--build-budget B): a build still running after B times the median
# of this run's builds is stopped and its point pruned. In a 4096 fp32 study on the H200
# (16 cores, 1151 NVRTC builds in 120 s) the median build took 1.05 s, yet the 5% of
# builds past 3.6 s took 16% of all build time (up to 27 s: TILE_K 64 kernels), and
# none of them came within 5% of the study's best.
BUILD_BUDGET = 4.0  # B by default
BUILD_BUDGET_FLOOR_S = 2.0  # a build is never stopped sooner
BUILD_BUDGET_AFTER = 20  # builds of this run needed before the budget applies
OVER_BUDGET = "build stopped after"  # how the message of an over-budget trial begins


def over_budget_message(time_limit_s: float) -> str:
    """What a trial whose build was stopped at the study's build budget says."""
    return (f"{OVER_BUDGET} {time_limit_s:.1f} s, the study's build budget "
            "(--build-budget times its median build)")


class Backend(Protocol):
    """A backend driver. Errors are typed (peak_tune.errors); the runner maps them."""

    name: str
    capabilities: Capabilities

    def probe(self) -> DeviceProfile:
        """The device this backend drives here; raises BackendUnavailable if none."""
        ...

    def fingerprint(self) -> Mapping[str, str]:
        """Device, compiler version and flags, harness version: part of evaluation keys."""
        ...

    def compile(
        self, context: KernelContext, params: Mapping[str, int], dtype: str, build_dir: str,
        time_limit_s: float = 0.0,
    ) -> Artifact:
        """Compile with parameters as -D macros; raises CompileError with the log, or
        BuildOverBudget when the compiler outlasts `time_limit_s` (0: only the backend's
        own hang limit), having stopped it."""
        ...

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        """Validate and time in an isolated process.

        Raises WrongResult, KernelCrash or KernelTimeout; the process is replaced after a
        crash or timeout so the next evaluation starts clean.
        """
        ...

    def time_vendor(
        self, spec: KernelSpec, dtype: str, size: ProblemSize, config: EvalConfig
    ) -> tuple[str, Measurement]:
        """(vendor library name, its timing) measured by the same code as the variants."""
        ...

    def close(self) -> None:
        """Stop worker processes."""
        ...
