"""Device-side validation and timing for the CUDA worker (runs only in that process).

Validation: each buffer, with its guard regions (validation.GuardedBuffer's sentinel
bytes), is one device allocation and the kernel gets a pointer past the front guard;
outputs arrive poisoned with random values. The allocation ends at unmapped memory
(_cuda_fence): its back guard is cut to the few bytes that keep it aligned, so an access
past a buffer's end faults however far it reaches and whatever it writes. The inputs
of a seed are made once by validation.make_problem and kept on the device with their
float64 reference (peak_tune.backends._cuda_check); each check copies them device to
device into fresh allocations, and after the run the device compares guards, inputs and
outputs; only a failing run comes back to the host, where validation.check_outputs names
the failure.

Seeds are secret: the worker draws a random base at start (`state.seed_base`), and the
parent's seed only picks an offset from it, so no kernel can carry answers for them.

Timing: on one non-default stream, for each run: fresh buffers copied from a reference
of its own (every timed run has inputs no other run of the evaluation had), outputs
poisoned with a byte that changes from run to run, L2 flushed by writing a buffer twice
its size, then CUDA events around the launch alone on that stream; `warmup` runs first,
at most `repeats` timed runs, and EVERY run's output is checked on the device against its
own reference (the counts are added up on the device; one synchronisation a batch).
The runs are held for their check in batches of at most a quarter of the device's
memory (references and buffers), the cached references take at most another quarter:
each 8192 fp32 run holds about 2.6 GB, so 23 runs held together (3 warm-up, 20 timed)
did not fit an 80 GB GPU (PEAK_TUNE_HELD_RUNS_BYTES sets the held runs' share instead,
e.g. on a GPU that other work shares). Kernels and cuBLAS go through the same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.backends._cuda_check import (
    Reference,
    ReferenceCache,
    device_view,
    failure_count,
    upload,
)
from peak_tune.backends._cuda_fence import SLACK_BYTE, Block, FencedBlocks
from peak_tune.backends._cuda_launch import TensorMapBox
from peak_tune.backends._cuda_tma import TENSOR_MAP_BYTES, encode, layout_for
from peak_tune.backends.wire import Timing
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import InvalidPoint, KernelCrash, UserError
from peak_tune.evaluation.validation import (
    OutOfBounds,
    Problem,
    check_outputs,
    compute_expected,
    guard_elements,
    make_problem,
)
from peak_tune.harness.values import secret_seed

__all__ = ["Binder", "Call", "DeviceFault", "DeviceProblem", "Timing", "cupy_module",
           "device_errors", "guarded", "in_stream", "phase", "phases_ms", "references",
           "state", "time_then_check", "validate"]

_POISON_BYTES = (0xFF, 0x7F, 0x3C, 0xC4, 0x41, 0xBE)  # NaN, huge, ~0.01, ~-600, 12, -0.4
_POOL_OFFSET = 1000  # timed runs' seeds: base + this + run index
HELD_RUNS_VARIABLE = "PEAK_TUNE_HELD_RUNS_BYTES"  # bytes of runs held for one check
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
    multiprocessors: int = 0  # SMs (CUDA) or compute units (ROCm): launch name SMS
    seed_base: int = 0  # secret: every seed of this process is base + an offset
    round: int = 0  # runs so far: picks the poison byte
    fenced: FencedBlocks | None = None  # None: plain allocations (no VMM in this driver)
    held_budget_bytes: int = 0  # device bytes of runs held for their check at most


state = _State()
references = ReferenceCache()  # pristine inputs and float64 references, on the device
phases_ms: dict[str, float] = {}  # host time per phase of the current request


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the wall time of the block to phases_ms[name]."""
    began = time.perf_counter()
    try:
        yield
    finally:
        phases_ms[name] = phases_ms.get(name, 0.0) + (time.perf_counter() - began) * 1e3


def cupy_module() -> Any:
    """cupy, with this process's stream, L2 flush buffer and limits set up (first call)."""
    if state.cp is None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        state.stream = cupy.cuda.Stream(non_blocking=True)
        flush_bytes = max(2 * int(props["l2CacheSize"]), _MIN_FLUSH_BYTES)
        state.flush = cupy.empty(flush_bytes, np.uint8)
        # ROCm's properties may lack the opt-in figure: a block's LDS is the limit there
        state.shared_limit = int(props.get("sharedMemPerBlockOptin")
                                 or props["sharedMemPerBlock"])
        state.multiprocessors = int(props["multiProcessorCount"])
        quarter = int(props["totalGlobalMem"]) // 4
        state.held_budget_bytes = _held_budget(os.environ.get(HELD_RUNS_VARIABLE), quarter)
        references.budget_bytes = min(references.budget_bytes, quarter)
        state.seed_base = secret_seed()
        fenced = FencedBlocks(cupy.cuda.runtime.getDevice())
        state.fenced = fenced if fenced.available else None
        state.cp = cupy
    return state.cp


def _held_budget(setting: str | None, default: int) -> int:
    """The bytes of runs held for one check: PEAK_TUNE_HELD_RUNS_BYTES where set."""
    if not setting:
        return default
    if not setting.isdigit():
        raise UserError(f"{HELD_RUNS_VARIABLE} must be a number of bytes, not {setting!r}")
    return int(setting)


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
    """A Reference's buffers copied (device to device) into fresh guarded allocations."""

    def __init__(self, reference: Reference) -> None:
        cupy_module()
        self.reference = reference
        self.size = reference.size
        self.storage: dict[str, Any] = {}  # guarded storage, a prefix of the pristine's
        self.inner: dict[str, Any] = {}
        self.blocks: dict[str, Block] = {}  # buffer name -> its fenced block
        with state.stream:
            for arg in reference.buffers:
                pristine = reference.pristine[arg.name]
                count = int(np.prod(reference.shapes[arg.name], dtype=np.int64))
                guard = guard_elements(pristine.itemsize)
                self.storage[arg.name] = self._allocate(arg.name, pristine,
                                                        (guard + count) * pristine.itemsize)
                copy_on_device(self.storage[arg.name], pristine)
                self.inner[arg.name] = self.storage[arg.name][guard:guard + count]

    def _allocate(self, name: str, pristine: Any, nbytes: int) -> Any:
        """Storage for the front guard and the buffer (`nbytes`): fenced where the driver
        can, its size rounded up within the pristine's back guard; else all of it."""
        cp = cupy_module()
        if state.fenced is None:
            return cp.empty_like(pristine)
        block = self.blocks[name] = state.fenced.take(nbytes)
        if block.slack.nbytes:  # a kernel may have written there in an earlier run
            cp.cuda.runtime.memsetAsync(block.slack.data.ptr, SLACK_BYTE,
                                        block.slack.nbytes, state.stream.ptr)
        return block.storage.view(pristine.dtype)

    def __del__(self) -> None:
        fenced = state.fenced
        if fenced is None:
            return
        try:
            for block in self.blocks.values():
                fenced.give_back(block)
        except Exception:  # the worker is ending (its context gone): nothing to give back
            pass

    @property
    def nbytes(self) -> int:
        """Device bytes this run holds: its buffers and its reference."""
        return sum(int(a.nbytes) for a in self.storage.values()) + self.reference.nbytes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.reference.shapes[name]

    def poison_outputs(self) -> None:
        """Outputs poisoned again with this round's byte (inout buffers: their inputs
        again), on the device."""
        cp = cupy_module()
        state.round += 1
        byte = _POISON_BYTES[state.round % len(_POISON_BYTES)]
        for arg in self.reference.buffers:
            inner = self.inner[arg.name]
            if arg.intent == "inout":
                pristine = self.reference.pristine[arg.name]
                guard = guard_elements(pristine.itemsize)
                copy_on_device(inner, pristine[guard:guard + inner.size])
            elif arg.intent == "out" and inner.nbytes:
                cp.cuda.runtime.memsetAsync(inner.data.ptr, byte, inner.nbytes,
                                            state.stream.ptr)

    def kernel_args(self) -> tuple[Any, ...]:
        """Arguments in the spec's order: inner device arrays and C ints."""
        values: list[Any] = []
        for arg in self.reference.spec.args:
            if arg.kind == "buffer":
                values.append(self.inner[arg.name])
                continue
            value = self.reference.scalars[arg.name]
            if abs(value) >= _INT_LIMIT:
                raise UserError(f"scalar {arg.name} = {value} at {self.reference.label} "
                                "does not fit a C int")
            values.append(np.int32(value))
        return tuple(values)

    def pointer(self, name: str) -> int:
        return int(self.inner[name].data.ptr)

    def tensor_map(self, box: TensorMapBox) -> Any:
        """The buffer's TMA tensor map in device memory (an array the kernel gets as a
        pointer), or a null pointer where TMA cannot describe the buffer (_cuda_tma)."""
        cp = cupy_module()
        inner = self.inner[box.buffer]
        layout = layout_for(box, self.shape(box.buffer), inner.itemsize, int(inner.data.ptr))
        if layout is None:
            return np.uint64(0)
        tensor_map = cp.empty(TENSOR_MAP_BYTES, np.uint8)
        tensor_map.set(np.frombuffer(encode(layout), np.uint8), stream=state.stream)
        return tensor_map

    def failures(self) -> Any:
        """How many bytes and elements of this run fail (a device scalar, not waited for)."""
        return failure_count(self.reference, self.storage,
                             [block.slack for block in self.blocks.values()], SLACK_BYTE)

    def check(self, others: Sequence[DeviceProblem] = ()) -> None:
        """Raise WrongResult (OutOfBounds for stray writes) unless this run (and each of
        `others`) was correct: counted on the device; a failure is downloaded and named
        by check_outputs."""
        cp = cupy_module()
        runs = [*others, self]
        with state.stream:
            counts = cp.stack([references.changed([r.reference for r in runs]),
                               *[r.failures() for r in runs]])
            changed, *failures = (int(n) for n in counts.get(stream=state.stream))
        if changed:
            references.clear()
            raise OutOfBounds(f"wrote out of bounds: device memory outside the buffers "
                              f"changed at {self.reference.label} (validation data)")
        for run, failed in zip(runs, failures, strict=True):
            if failed:
                run.fail()

    def fail(self) -> None:
        """This run failed on the device: name the failure on the host."""
        ref = self.reference
        for name, block in self.blocks.items():
            if bool((block.slack != SLACK_BYTE).any()):
                raise OutOfBounds(f"wrote out of bounds: memory before {name}'s front guard "
                                  f"changed at {ref.label}")
        self.check_on_host(make_problem(ref.spec, ref.size, ref.dtype, ref.seed))
        raise RuntimeError(f"validation at {ref.label}: the device found a difference "
                           "that the host check does not see")

    def check_on_host(self, problem: Problem) -> None:
        """Download every allocation, guards included, into `problem` (made from the same
        seed) and check it there with validation.check_outputs."""
        for buffer in problem.buffers:
            stored = self.storage[buffer.arg.name]
            stored.get(stream=state.stream, out=device_view(buffer.storage)[:stored.size])
        state.stream.synchronize()
        check_outputs(problem, compute_expected(problem))


def copy_on_device(target: Any, source: Any) -> None:
    """Copy a contiguous device array into another of its size or shorter (the source's
    first bytes), on our stream."""
    target.data.copy_from_device_async(source.data, target.nbytes, stream=state.stream)


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


def validate(
    spec: KernelSpec, size: ProblemSize, dtype: str, seed: int, bind: Binder,
    on_host: bool = False,
) -> float:
    """Fresh guarded buffers from the seed's inputs, poisoned outputs: run once and check
    (raises WrongResult); the run's wall time in ms. `on_host`: nothing cached, checked
    on the host, so the device runs the copies and the kernel alone (compute-sanitizer)."""
    problem = make_problem(spec, size, dtype, secret_seed()) if on_host else None
    device = _device_problem(spec, size, dtype, seed, problem)
    began = time.perf_counter()
    with phase("run"):
        guarded(bind(device))
    ran_ms = (time.perf_counter() - began) * 1e3
    with phase("check"):
        if problem is None:
            device.check()
        else:
            device.check_on_host(problem)
    return ran_ms


def _device_problem(
    spec: KernelSpec, size: ProblemSize, dtype: str, seed: int, problem: Problem | None
) -> DeviceProblem:
    cupy_module()
    with phase("inputs"), state.stream:  # uploads and copies in order on our stream
        if problem is not None:
            return DeviceProblem(upload(problem, None))
        return DeviceProblem(references.get(spec, size, dtype, state.seed_base + seed))


def time_then_check(
    spec: KernelSpec, size: ProblemSize, dtype: str, seed: int, bind: Binder, timing: Timing,
    validated_ms: float = 0.0,
) -> list[float]:
    """Samples in ms (CUDA events around each launch), every run on inputs of its own and
    checked. `validated_ms`: how long the validation run just before took; a kernel
    slower than the slow cutoff is warm from it and gets its single timed run without a
    warm-up. `seed` is unused: the runs' seeds are this process's own pool."""
    cp = cupy_module()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    held: list[DeviceProblem] = []  # runs not yet checked
    runs = 0

    def timed() -> float:
        nonlocal runs
        if held and (len(held) + 1) * held[-1].nbytes > state.held_budget_bytes:
            _check_runs(held)  # one more would not fit: check these, let them go
        device = _device_problem(spec, size, dtype, _POOL_OFFSET + runs, None)
        runs += 1
        run = bind(device)
        device.poison_outputs()
        _flush_l2(state.round)

        def launch() -> None:
            start.record(state.stream)
            run()
            end.record(state.stream)

        guarded(launch)
        held.append(device)
        return float(cp.cuda.get_elapsed_time(start, end))

    with phase("timing"):
        estimate_ms: float | None = None
        slow = 0 < timing.slow_cutoff_ms < validated_ms
        for _ in range(0 if slow else timing.warmup):
            estimate_ms = timed()
        if slow:
            estimate_ms = validated_ms
        samples_ms: list[float] = []
        target = timing.repeats if estimate_ms is None else timing.repeat_count(estimate_ms)
        while len(samples_ms) < target:
            samples_ms.append(timed())
            if estimate_ms is None:
                estimate_ms = samples_ms[0]
                target = timing.repeat_count(estimate_ms)
    with phase("check"):
        _check_runs(held)
    return samples_ms


def _check_runs(runs: list[DeviceProblem]) -> None:
    """Check every run of `runs` (one synchronisation), then empty the list: their
    buffers go back and their references may go."""
    runs[-1].check(runs[:-1])
    runs.clear()
