"""Device-side validation and timing for the CUDA worker (runs only in that process).

Validation: each buffer is copied with its guard regions (validation.GuardedBuffer's
sentinel bytes) into one device allocation and the kernel gets a pointer past the front
guard; outputs arrive poisoned with NaN; after the run the whole allocation comes back
and validation.check_outputs looks at the guards, the inputs and the outputs.

Timing: on one non-default stream, for each run: outputs poisoned (memset 0xFF, a NaN in
every float type), L2 flushed by writing a buffer twice its size, then CUDA events around
the launch alone on that stream; `warmup` runs first, at most `repeats` timed runs, and
the last timed run's output is checked. Kernels and cuBLAS go through the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.backends._wire import Timing
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import InvalidPoint, KernelCrash, UserError
from peak_tune.validation import (
    GUARD_ELEMENTS,
    Problem,
    check_outputs,
    compute_expected,
    make_problem,
)

__all__ = ["Binder", "Call", "DeviceFault", "DeviceProblem", "cupy_module",
           "device_errors", "guarded", "in_stream", "state", "time_then_check", "validate"]

_POISON_BYTE = 0xFF  # 0xFF..FF is a NaN in float16, float32 and float64
_INT_LIMIT = 2**31
_MIN_FLUSH_BYTES = 8 << 20

Call = Callable[[], None]


class DeviceFault(KernelCrash):
    """A CUDA error that leaves the context unusable: the parent restarts this process."""

    taints_process = True


@dataclass
class _State:
    cp: Any = None  # the cupy module, imported on first use
    stream: Any = None  # every copy, launch and event of this process goes here
    flush: Any = None  # device buffer twice the L2 size
    shared_limit: int = 0  # bytes of shared memory a block may opt in to


state = _State()


def cupy_module() -> Any:
    """cupy, with this process's stream, L2 flush buffer and limits set up (first call)."""
    if state.cp is None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        state.stream = cupy.cuda.Stream(non_blocking=True)
        flush_bytes = max(2 * int(props["l2CacheSize"]), _MIN_FLUSH_BYTES)
        state.flush = cupy.empty(flush_bytes, np.uint8)
        state.shared_limit = int(props["sharedMemPerBlockOptin"])
        state.cp = cupy
    return state.cp


def device_errors() -> tuple[type[Exception], ...]:
    cp = cupy_module()
    return (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)


def guarded(action: Call, wait: bool = True) -> None:
    """Run device work (and wait for it); CUDA errors become typed failures."""
    try:
        action()
        if wait:
            state.stream.synchronize()
    except device_errors() as exc:
        if "OUT_OF_RESOURCES" in str(exc):
            raise InvalidPoint(f"launch refused: {exc}") from None
        raise DeviceFault(f"kernel crashed: {exc}") from None


class DeviceProblem:
    """A validation.Problem on the device: each buffer with its guards, one allocation."""

    def __init__(self, host: Problem) -> None:
        cp = cupy_module()
        self.host = host
        self.storage: dict[str, Any] = {}
        self.inner: dict[str, Any] = {}
        for buffer in host.buffers:
            name = buffer.arg.name
            self.storage[name] = cp.empty(buffer.storage.shape, buffer.storage.dtype)
            self.storage[name].set(buffer.storage, stream=state.stream)
            self.inner[name] = self.storage[name][GUARD_ELEMENTS:GUARD_ELEMENTS + buffer.count]

    def poison_outputs(self) -> None:
        cp = cupy_module()
        for buffer in self.host.outputs:
            inner = self.inner[buffer.arg.name]
            if buffer.arg.intent == "inout":
                inner.set(self.host.originals[buffer.arg.name].ravel(), stream=state.stream)
            elif inner.nbytes:
                cp.cuda.runtime.memsetAsync(inner.data.ptr, _POISON_BYTE, inner.nbytes,
                                            state.stream.ptr)

    def download(self) -> None:
        """Every allocation back into the host problem, guards included."""
        for buffer in self.host.buffers:
            self.storage[buffer.arg.name].get(stream=state.stream, out=buffer.storage)
        state.stream.synchronize()

    def kernel_args(self) -> tuple[Any, ...]:
        """Arguments in the spec's order: inner device arrays and C ints."""
        values: list[Any] = []
        for arg in self.host.spec.args:
            if arg.kind == "buffer":
                values.append(self.inner[arg.name])
                continue
            value = self.host.scalars[arg.name]
            if abs(value) >= _INT_LIMIT:
                raise UserError(f"scalar {arg.name} = {value} at {self.host.label} "
                                "does not fit a C int")
            values.append(np.int32(value))
        return tuple(values)

    def pointer(self, name: str) -> int:
        return int(self.inner[name].data.ptr)


Binder = Callable[[DeviceProblem], Call]


def in_stream(bind: Binder) -> Binder:
    """Launches and cuBLAS calls go to CuPy's current stream: make it ours."""

    def bound(device: DeviceProblem) -> Call:
        run = bind(device)

        def on_stream() -> None:
            with state.stream:
                run()

        return on_stream

    return bound


def _flush_l2(round_: int) -> None:
    cp = cupy_module()
    cp.cuda.runtime.memsetAsync(state.flush.data.ptr, round_ % 256, state.flush.nbytes,
                                state.stream.ptr)


def validate(spec: KernelSpec, size: ProblemSize, dtype: str, seed: int, bind: Binder) -> None:
    """Fresh inputs, poisoned outputs, guards: run once and check (raises WrongResult)."""
    problem = make_problem(spec, size, dtype, seed)
    device = DeviceProblem(problem)
    guarded(bind(device), wait=False)
    expected = compute_expected(problem)  # on the CPU while the kernel runs
    guarded(lambda: None)
    device.download()
    check_outputs(problem, expected)


def time_then_check(
    spec: KernelSpec, size: ProblemSize, dtype: str, seed: int, bind: Binder, timing: Timing
) -> list[float]:
    """Samples in ms (CUDA events around each launch), then the last output checked."""
    cp = cupy_module()
    problem = make_problem(spec, size, dtype, seed)
    device = DeviceProblem(problem)
    run = bind(device)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    rounds = 0

    def timed() -> float:
        nonlocal rounds
        rounds += 1
        device.poison_outputs()
        _flush_l2(rounds)

        def launch() -> None:
            start.record(state.stream)
            run()
            end.record(state.stream)

        guarded(launch)
        return float(cp.cuda.get_elapsed_time(start, end))

    estimate_ms: float | None = None
    for _ in range(timing.warmup):
        estimate_ms = timed()
    samples_ms: list[float] = []
    target = timing.repeats if estimate_ms is None else timing.repeat_count(estimate_ms)
    while len(samples_ms) < target:
        samples_ms.append(timed())
        if estimate_ms is None:
            estimate_ms = samples_ms[0]
            target = timing.repeat_count(estimate_ms)
    expected = compute_expected(problem)
    device.download()
    check_outputs(problem, expected)
    return samples_ms
