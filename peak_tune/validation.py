"""Backend-neutral validation on the host: inputs, guard regions, the float64 reference.

A `Problem` holds one set of inputs and outputs for a KernelSpec at a ProblemSize and
dtype. Every buffer lives inside a larger allocation whose first and last
`GUARD_ELEMENTS` elements hold a sentinel bit pattern; the kernel gets the inner part.
Outputs are poisoned with NaN before each run and inputs are kept as copies, so a check
after the run can tell a stray write, a changed input, an unwritten output and a wrong
value apart, each with a one-line message a user understands.

GPU backends copy `Problem.arrays()` to the device and back and call `check_outputs`;
host backends (C) pass pointers to the inner arrays directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.core import ArgSpec, KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import CatalogError, InvalidPoint, UserError, WrongResult
from peak_tune.expr import evaluate, evaluate_bool, evaluate_int

__all__ = [
    "GUARD_ELEMENTS",
    "Expected",
    "GuardedBuffer",
    "OutOfBounds",
    "Problem",
    "applicable_sizes",
    "check_outputs",
    "compute_expected",
    "make_problem",
    "numpy_dtype",
    "require_size_constraints",
    "size_label",
    "validate_host",
]

_log = logging.getLogger(__name__)

GUARD_ELEMENTS = 1024  # elements of sentinel before and after every buffer
_SENTINEL_BYTE = 0xA5  # the guard bit pattern, byte by byte
_ABS_FLOOR = 1e-30  # absolute tolerance added to the relative one (scale 0 stays checkable)
_DTYPES: dict[str, type[np.floating[Any]]] = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
_INITIALISERS = ("uniform", "normal", "zeros", "ones")


class OutOfBounds(WrongResult):
    """The kernel wrote into a guard region: the process's memory may be corrupt."""

    taints_process = True


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype for a dtype name ("float32"); UserError for an unknown name."""
    if dtype not in _DTYPES:
        known = ", ".join(_DTYPES)
        raise UserError(f"unknown dtype {dtype!r}: expected one of {known}")
    return np.dtype(_DTYPES[dtype])


def size_label(spec: KernelSpec, size: ProblemSize) -> str:
    """Sizes in the spec's symbol order, e.g. "67x53x97" for M, N, K."""
    values = size.as_dict()
    symbols = spec.size_symbols or tuple(values)
    return "x".join(str(values[s]) for s in symbols)


def applicable_sizes(
    context: KernelContext, params: Mapping[str, int], sizes: Iterable[ProblemSize]
) -> tuple[ProblemSize, ...]:
    """The sizes that meet every size constraint the variant declares."""
    return tuple(s for s in sizes if _unmet_constraint(context, params, s) is None)


def require_size_constraints(
    context: KernelContext, params: Mapping[str, int], size: ProblemSize
) -> None:
    """Raise InvalidPoint if `size` breaks a size constraint of the variant."""
    unmet = _unmet_constraint(context, params, size)
    if unmet is not None:
        named = " ".join(f"{k}={v}" for k, v in size.values)
        raise InvalidPoint(f"size {named} breaks the variant's constraint {unmet}")


def _unmet_constraint(
    context: KernelContext, params: Mapping[str, int], size: ProblemSize
) -> str | None:
    names = {**params, **size.as_dict()}
    return next((c for c in context.size_constraints if not evaluate_bool(c, names)), None)


@dataclass(frozen=True)
class GuardedBuffer:
    """One buffer argument inside a guarded allocation (`storage` is 1-D)."""

    arg: ArgSpec
    storage: np.ndarray
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def array(self) -> np.ndarray:
        """The inner part the kernel sees, C-contiguous, shaped."""
        return self.storage[GUARD_ELEMENTS : GUARD_ELEMENTS + self.count].reshape(self.shape)

    def guard_hit(self) -> str | None:
        """"before" or "after" if that guard no longer holds the sentinel, else None."""
        raw = self.storage.view(np.uint8)
        guard_bytes = GUARD_ELEMENTS * self.storage.itemsize
        if np.any(raw[:guard_bytes] != _SENTINEL_BYTE):
            return "before"
        if np.any(raw[raw.size - guard_bytes :] != _SENTINEL_BYTE):
            return "after"
        return None


@dataclass(frozen=True)
class Problem:
    """Inputs and outputs of one run of a kernel, with copies of what was passed in."""

    spec: KernelSpec
    size: ProblemSize
    dtype: str
    buffers: tuple[GuardedBuffer, ...]
    scalars: Mapping[str, int]
    originals: Mapping[str, np.ndarray]  # inputs (in, inout) as first given to the kernel
    seed: int | None = None  # the inputs are a function of it (see compute_expected)

    @property
    def label(self) -> str:
        return size_label(self.spec, self.size)

    @property
    def outputs(self) -> tuple[GuardedBuffer, ...]:
        return tuple(b for b in self.buffers if b.arg.intent in ("out", "inout"))

    def buffer(self, name: str) -> GuardedBuffer:
        return next(b for b in self.buffers if b.arg.name == name)

    def arrays(self) -> dict[str, np.ndarray]:
        """Buffer name -> the inner array the kernel sees."""
        return {b.arg.name: b.array for b in self.buffers}

    def call_values(self) -> list[np.ndarray | int]:
        """Arguments in the spec's order: inner arrays for buffers, ints for scalars."""
        arrays = self.arrays()
        return [arrays[a.name] if a.kind == "buffer" else self.scalars[a.name]
                for a in self.spec.args]

    def poison_outputs(self) -> None:
        """Fill outputs with NaN (inout buffers get their original values back)."""
        for buffer in self.outputs:
            if buffer.arg.intent == "inout":
                buffer.array[...] = self.originals[buffer.arg.name]
            else:
                buffer.array.fill(np.nan)


def make_problem(spec: KernelSpec, size: ProblemSize, dtype: str, seed: int) -> Problem:
    """Fresh random inputs (from `seed`), NaN-poisoned outputs, sentinel guards."""
    np_dtype = numpy_dtype(dtype)
    rng = np.random.default_rng(seed)
    sizes = size.as_dict()
    buffers: list[GuardedBuffer] = []
    scalars: dict[str, int] = {}
    originals: dict[str, np.ndarray] = {}
    for arg in spec.args:
        if arg.kind == "scalar":
            scalars[arg.name] = evaluate_int(arg.value, sizes)
            continue
        buffer = _allocate(spec, arg, sizes, np_dtype)
        if arg.intent in ("in", "inout"):
            buffer.array[...] = _initial_values(spec, arg, buffer.shape, rng)
            originals[arg.name] = buffer.array.copy()
        buffers.append(buffer)
    problem = Problem(spec, size, dtype, tuple(buffers), scalars, originals, seed)
    problem.poison_outputs()
    return problem


def _allocate(
    spec: KernelSpec, arg: ArgSpec, sizes: Mapping[str, int], np_dtype: np.dtype[Any]
) -> GuardedBuffer:
    shape = tuple(evaluate_int(expr, sizes) for expr in arg.shape)
    if any(extent < 0 for extent in shape):
        raise CatalogError(spec.folder or spec.name, f"args.{arg.name}.shape",
                           f"negative extent {shape} at sizes {sizes}")
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.full((count + 2 * GUARD_ELEMENTS) * np_dtype.itemsize, _SENTINEL_BYTE, np.uint8)
    return GuardedBuffer(arg, raw.view(np_dtype), shape)


def _initial_values(
    spec: KernelSpec, arg: ArgSpec, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    if arg.init == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    if arg.init == "normal":
        return rng.standard_normal(shape)
    if arg.init == "zeros":
        return np.zeros(shape)
    if arg.init == "ones":
        return np.ones(shape)
    raise CatalogError(spec.folder or spec.name, f"args.{arg.name}.init",
                       f"unknown initialiser {arg.init!r}; expected one of {_INITIALISERS}")


@dataclass(frozen=True)
class Expected:
    """The float64 reference per output and the allowed absolute error per element."""

    values: Mapping[str, np.ndarray]
    bounds: Mapping[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.values.values(), *self.bounds.values()))


class _Memo:
    """Recent references by (spec, size, dtype, seed), up to a byte budget: every
    evaluation in a worker uses the same seeds, so the float64 reference (seconds at
    4096 on the host) is computed once per size instead of once per variant. The
    inputs are still fresh buffers each check, and a kernel cannot know its seed."""

    def __init__(self, budget_bytes: int = 2 << 30) -> None:
        self.budget_bytes = budget_bytes
        self.entries: dict[tuple[Any, ...], Expected] = {}

    def get(self, key: tuple[Any, ...]) -> Expected | None:
        found = self.entries.pop(key, None)
        if found is not None:
            self.entries[key] = found  # most recent last
        return found

    def put(self, key: tuple[Any, ...], expected: Expected) -> None:
        self.entries[key] = expected
        while len(self.entries) > 1 and sum(e.nbytes for e in self.entries.values()) > \
                self.budget_bytes:
            self.entries.pop(next(iter(self.entries)))


_MEMO = _Memo()


def compute_expected(problem: Problem) -> Expected:
    """spec.reference and spec.error_scale in float64 over the inputs (memoised by seed)."""
    spec = problem.spec
    key = (spec.name, spec.args, spec.reference, spec.error_scale, problem.size.values,
           problem.dtype, problem.seed, tuple(spec.tolerances.items()))
    if problem.seed is not None:
        found = _MEMO.get(key)
        if found is not None:
            return found
    expected = _compute_expected(problem)
    if problem.seed is not None:
        _MEMO.put(key, expected)
    return expected


def _compute_expected(problem: Problem) -> Expected:
    spec = problem.spec
    if problem.dtype not in spec.tolerances:
        raise CatalogError(spec.folder or spec.name, "tolerance",
                           f"no tolerance for {problem.dtype}")
    tolerance = float(spec.tolerances[problem.dtype])
    names: dict[str, Any] = {**problem.size.as_dict(), **problem.scalars}
    names.update({n: a.astype(np.float64) for n, a in problem.originals.items()})
    values = _per_output(problem, "reference", evaluate(spec.reference, names))
    scales = _per_output(problem, "error_scale", evaluate(spec.error_scale, names))
    bounds = {n: tolerance * np.abs(s) + _ABS_FLOOR for n, s in scales.items()}
    return Expected(values, bounds)


def _per_output(problem: Problem, field: str, result: Any) -> dict[str, np.ndarray]:
    outputs = problem.outputs
    results = list(result) if isinstance(result, tuple | list) else [result]
    where = problem.spec.folder or problem.spec.name
    if len(results) != len(outputs):
        raise CatalogError(where, field, f"gives {len(results)} value(s) for "
                           f"{len(outputs)} output(s)")
    by_name: dict[str, np.ndarray] = {}
    for buffer, value in zip(outputs, results, strict=True):
        array = np.broadcast_to(np.asarray(value, dtype=np.float64), buffer.shape)
        by_name[buffer.arg.name] = array
    return by_name


def check_outputs(problem: Problem, expected: Expected) -> None:
    """Raise WrongResult (OutOfBounds for guard hits) unless the run was correct."""
    at = problem.label
    for buffer in problem.buffers:
        side = buffer.guard_hit()
        if side is not None:
            raise OutOfBounds(f"wrote out of bounds: guard {side} {buffer.arg.name} "
                              f"changed at {at}")
    for buffer in problem.buffers:
        if buffer.arg.intent == "in":
            original = problem.originals[buffer.arg.name]
            if not np.array_equal(buffer.array.view(np.uint8), original.view(np.uint8)):
                raise WrongResult(f"input {buffer.arg.name} changed by the kernel at {at}")
    for buffer in problem.outputs:
        _check_output(buffer, expected, at)


def _check_output(buffer: GuardedBuffer, expected: Expected, at: str) -> None:
    name = buffer.arg.name
    out = buffer.array.astype(np.float64)
    unwritten = np.isnan(out)
    if unwritten.any():
        first = _index(name, np.unravel_index(int(np.argmax(unwritten)), out.shape))
        count = int(unwritten.sum())
        raise WrongResult(f"output {name} not written (NaN left) at {at}: "
                          f"{count} of {out.size} elements, first {first}")
    error = np.abs(out - expected.values[name])
    bound = expected.bounds[name]
    off = ~(error <= bound)  # inf and nan errors count as off
    if not off.any():
        return
    ratio = np.where(off, error / bound, 0.0)
    ratio = np.nan_to_num(ratio, nan=np.inf)
    worst = np.unravel_index(int(np.argmax(ratio)), out.shape)
    message = (f"wrong result at {at}: {int(off.sum())} of {out.size} elements off, "
               f"worst {_index(name, worst)} = {out[worst]:.6g} "
               f"(expected {expected.values[name][worst]:.6g})")
    detail = (f"{message}\nallowed error there: {bound[worst]:.3g}; "
              f"largest error: {float(np.nanmax(error)):.3g} "
              f"({float(ratio[worst]):.3g} x the allowed error)\n"
              f"first elements off: {_examples(name, out, expected.values[name], off)}")
    raise WrongResult(message, detail=detail)


def _examples(name: str, out: np.ndarray, expected: np.ndarray, off: np.ndarray,
              count: int = 4) -> str:
    """The first `count` wrong elements in memory order: "C[0,3] = 1 (expected 2)"."""
    flat = np.flatnonzero(off.ravel())[:count]
    shown = []
    for position in flat:
        index = np.unravel_index(int(position), out.shape)
        shown.append(f"{_index(name, index)} = {out[index]:.6g} (expected {expected[index]:.6g})")
    return ", ".join(shown)


def _index(name: str, index: tuple[Any, ...]) -> str:
    return f"{name}[{','.join(str(int(i)) for i in index)}]"


def validate_host(
    spec: KernelSpec, size: ProblemSize, dtype: str, seed: int,
    run: Callable[[Problem], None],
) -> None:
    """One validation with host memory: fresh inputs, run, check (raises WrongResult)."""
    problem = make_problem(spec, size, dtype, seed)
    expected = compute_expected(problem)
    run(problem)
    check_outputs(problem, expected)
    _log.debug("valid at %s (%s, seed %d)", problem.label, dtype, seed)
