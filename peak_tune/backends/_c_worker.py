"""The C backend's evaluation worker (a child process; see peak_tune.backends._worker).

`python -m peak_tune.backends._c_worker --request-fd R --response-fd W` loads compiled
kernels with ctypes, validates them against the float64 reference and times them; the
vendor baseline (numpy) is timed here too, by the same code.

Validation: at every check size, then at the timed size (that run is the warm-up).
Timing: up to `repeats` runs each timed with
`time.perf_counter_ns` around the call alone. Before every timed run the outputs are
poisoned and the caches flushed by touching a buffer larger than the last-level cache
(capped, see `_flush_bytes`); the output of the last timed run is checked again.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from peak_tune.backends._wire import Timing
from peak_tune.backends._worker import serve, spec_from_wire
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import CompileError, UserError
from peak_tune.expr import evaluate
from peak_tune.validation import (
    Expected,
    Problem,
    check_outputs,
    compute_expected,
    make_problem,
)

_log = logging.getLogger(__name__)

_C_TYPES: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
}
_FLUSH_MIN_BYTES = 8 << 20
_FLUSH_MAX_BYTES = 256 << 20
_INT_LIMIT = 2**31
_BLAS_SETTLE_S = 0.3  # after timing numpy, let OpenBLAS's spinning threads go to sleep

_libraries: dict[str, ctypes.CDLL] = {}
_flusher: _CacheFlusher | None = None

Call = Callable[[], None]


class _CacheFlusher:
    """Evicts the caches by reading and writing a buffer larger than the last level."""

    def __init__(self, nbytes: int) -> None:
        self._buffer = np.ones(nbytes // 8)

    def flush(self) -> None:
        self._buffer += 1.0


def _flush_bytes() -> int:
    """1.5 x the largest cache sysfs reports, within [8 MiB, 256 MiB]."""
    largest = 0
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return min(max(largest * 3 // 2, _FLUSH_MIN_BYTES), _FLUSH_MAX_BYTES)


def _cache_flusher() -> _CacheFlusher:
    global _flusher
    if _flusher is None:
        _flusher = _CacheFlusher(_flush_bytes())
    return _flusher


def _bind_kernel(
    library: str, entry: str, spec: KernelSpec, dtype: str
) -> Callable[[Problem], Call]:
    """Load `library` once; a function turning a Problem into a ready-to-time call."""
    if dtype not in _C_TYPES:
        raise UserError(f"the C backend supports {', '.join(_C_TYPES)}, not {dtype!r}")
    if library not in _libraries:
        try:
            _libraries[library] = ctypes.CDLL(library)
        except OSError as exc:
            raise CompileError(f"cannot load the compiled kernel: {exc}") from None
    try:
        function = getattr(_libraries[library], entry)
    except AttributeError:
        raise CompileError(f"entry point {entry!r} not found in the compiled kernel") from None
    pointer = ctypes.POINTER(_C_TYPES[dtype])
    function.argtypes = [pointer if a.kind == "buffer" else ctypes.c_int for a in spec.args]
    function.restype = None

    def bind(problem: Problem) -> Call:
        values: list[Any] = []
        for value in problem.call_values():
            if isinstance(value, np.ndarray):
                values.append(value.ctypes.data_as(pointer))
            elif abs(value) >= _INT_LIMIT:
                raise UserError(f"scalar {value} at {problem.label} does not fit a C int")
            else:
                values.append(value)
        return lambda: function(*values)

    return bind


def _timed_ns(call: Call) -> int:
    start = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - start


def _time_runs(call: Call, problem: Problem, timing: Timing,
               estimate_s: float | None) -> list[float]:
    """Samples in milliseconds; outputs poisoned and caches flushed before each run.

    `estimate_s` is the duration of a run just made (the validation run at this size),
    which then stands in for the warm-up.
    """
    flusher = _cache_flusher()
    for _ in range(timing.warmup if estimate_s is None else 0):
        problem.poison_outputs()
        estimate_s = _timed_ns(call) / 1e9
    samples_ms: list[float] = []
    target = timing.repeats if estimate_s is None else timing.repeat_count(estimate_s * 1e3)
    while len(samples_ms) < target:
        problem.poison_outputs()
        flusher.flush()
        elapsed_ns = _timed_ns(call)
        samples_ms.append(elapsed_ns / 1e6)
        if estimate_s is None:
            estimate_s = elapsed_ns / 1e9
            target = timing.repeat_count(estimate_s * 1e3)
    return samples_ms


def _expected(problem: Problem) -> Expected:
    """The float64 reference on one BLAS thread: OpenBLAS's threads spin for a while
    after a call and would slow the OpenMP kernel timed right after it."""
    with threadpool_limits(limits=1, user_api="blas"):
        return compute_expected(problem)


def _validate(spec: KernelSpec, size: ProblemSize, dtype: str, seed: int,
              bind: Callable[[Problem], Call]) -> float:
    """Fresh inputs, poisoned outputs, one run, checked; returns the run's seconds."""
    problem = make_problem(spec, size, dtype, seed)
    expected = _expected(problem)
    problem.poison_outputs()
    elapsed_s = _timed_ns(bind(problem)) / 1e9
    check_outputs(problem, expected)
    return elapsed_s


def _validate_then_time(
    spec: KernelSpec, dtype: str, size: ProblemSize, seed: int,
    bind: Callable[[Problem], Call], timing: Timing, estimate_s: float | None = None,
) -> list[float]:
    """Time at `size` on fresh inputs, then check the last timed run's output.

    The inputs differ from every earlier call's, so a kernel that returns a result
    saved from an earlier call fails here."""
    problem = make_problem(spec, size, dtype, seed)
    expected = _expected(problem)
    samples_ms = _time_runs(bind(problem), problem, timing, estimate_s)
    check_outputs(problem, expected)
    return samples_ms


def _evaluate(request: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_wire(request["spec"])
    dtype = str(request["dtype"])
    size = ProblemSize.of(request["size"])
    timing = Timing.of(request["config"])
    bind = _bind_kernel(request["library"], request["entry"], spec, dtype)
    seed = timing.seed
    for check in [ProblemSize.of(s) for s in request["check_sizes"]]:
        _validate(spec, check, dtype, seed, bind)
        seed += 1
    one_run_s = _validate(spec, size, dtype, seed, bind)
    samples_ms = _validate_then_time(spec, dtype, size, seed + 1, bind, timing, one_run_s)
    return {"samples_ms": samples_ms}


def _blas_name() -> str:
    """The BLAS numpy runs on, e.g. "scipy-openblas 0.3.31" (threadpoolctl if present)."""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("user_api") == "blas":
                return f"{info.get('internal_api', 'blas')} {info.get('version', '')}".strip()
    except ImportError:
        pass
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas.get('version', '')}".strip()
    except (KeyError, TypeError, AttributeError):
        return "numpy BLAS"


def _vendor_call(spec: KernelSpec, problem: Problem) -> Call:
    """numpy.matmul for matmul; otherwise the reference expression in the target dtype."""
    arrays = problem.arrays()
    inputs = [arrays[b.arg.name] for b in problem.buffers if b.arg.intent == "in"]
    outputs = [arrays[b.arg.name] for b in problem.outputs]
    if spec.name == "matmul" and len(inputs) == 2 and len(outputs) == 1:
        left, right, out = inputs[0], inputs[1], outputs[0]

        def run_matmul() -> None:
            np.matmul(left, right, out=out)

        return run_matmul
    names: dict[str, Any] = {**problem.size.as_dict(), **problem.scalars, **arrays}

    def run_reference() -> None:
        result = evaluate(spec.reference, names)
        results = list(result) if isinstance(result, tuple | list) else [result]
        for out, value in zip(outputs, results, strict=True):
            out[...] = value

    return run_reference


def _vendor(request: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_wire(request["spec"])
    dtype = str(request["dtype"])
    size = ProblemSize.of(request["size"])
    timing = Timing.of(request["config"])

    def bind(problem: Problem) -> Call:
        return _vendor_call(spec, problem)

    one_run_s = _validate(spec, size, dtype, timing.seed, bind)
    samples_ms = _validate_then_time(spec, dtype, size, timing.seed + 1, bind, timing,
                                     one_run_s)
    time.sleep(_BLAS_SETTLE_S)
    if spec.name == "matmul":
        name = f"numpy ({_blas_name()})"
    else:
        name = f"numpy (reference expression in {dtype})"
    return {"name": name, "samples_ms": samples_ms}


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return serve({"evaluate": _evaluate, "vendor": _vendor})


if __name__ == "__main__":
    sys.exit(main())
