"""Backend-neutral validation: inputs, guard regions, the float64 reference, the checks.

A `Problem` holds one set of inputs and outputs for a KernelSpec at a ProblemSize and
dtype. Every buffer lives inside a larger allocation whose first and last guard bytes
(`GUARD_BYTES`, a page or more) hold a fill the kernel must not change: NaN around the
inputs, so that a read past an input poisons the result, and a sentinel pattern around the
outputs. Inputs are signed values spread over magnitudes from a seed the kernel cannot
guess (peak_tune.harness.values); outputs are poisoned with random values before each
run, and an element still equal to its poison was not written. Inputs are kept as copies,
so a check after the run can tell a stray write, a changed input, an unwritten output and
a wrong value apart, each with a one-line message a user understands.

`check_outputs` compares every element with the float64 reference; where the spec
declares its reference linear in an input, peak_tune.evaluation.projections checks
random projections of the output instead, in O(n^2) (every timed run is checked so).

The allowed error per element is `tolerance * error_scale + ulp(dtype) * |reference|`:
the first term bounds accumulation in the dtype's precision in any summation order, the
second the final rounding to the output type.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from peak_tune.catalog.types import DTYPES
from peak_tune.core import ArgSpec, KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import CatalogError, InvalidPoint, UserError, WrongResult
from peak_tune.expr import evaluate, evaluate_bool, evaluate_int
from peak_tune.harness.values import float_format, random_poison, spread_values

__all__ = [
    "ABS_FLOOR",
    "GUARD_BYTES",
    "Expected",
    "GuardedBuffer",
    "OutOfBounds",
    "Problem",
    "applicable_sizes",
    "check_outputs",
    "check_memory",
    "compute_expected",
    "make_problem",
    "guard_elements",
    "numpy_dtype",
    "reference_names",
    "require_size_constraints",
    "size_label",
    "storage_bytes",
    "tolerance_of",
]

_log = logging.getLogger(__name__)

GUARD_BYTES = 64 << 10  # guard bytes before and after every buffer: 16 pages
_SENTINEL_BYTE = 0xA5  # the output guards' bit pattern, byte by byte
_INPUT_PAD_BYTE = 0xFF  # the input guards': 0xFF..FF is a NaN in every float type
ABS_FLOOR = 1e-30  # absolute tolerance added to the relative one (scale 0 stays checkable)
_INITIALISERS = ("uniform", "normal", "zeros", "ones")

Allocate = Callable[[int], np.ndarray]  # bytes -> a writable 1-D uint8 array of that size


class OutOfBounds(WrongResult):
    """The kernel wrote into a guard region: the process's memory may be corrupt."""

    taints_process = True


def guard_elements(itemsize: int) -> int:
    """Elements of guard before and after a buffer of this element size."""
    return GUARD_BYTES // itemsize


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype for a dtype name ("float32"); UserError for an unknown name."""
    if dtype not in DTYPES:
        known = ", ".join(DTYPES)
        raise UserError(f"unknown dtype {dtype!r}: expected one of {known}")
    if dtype == "bfloat16":
        # numpy has none: ml_dtypes' (CuPy has none either). Imported here, not above:
        # loading its extension takes 0.7-0.8 s of CPU, which every `peak-tune` process
        # (and every worker) paid at start whatever its dtype.
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


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
    def guard(self) -> int:
        return guard_elements(self.storage.itemsize)

    @property
    def array(self) -> np.ndarray:
        """The inner part the kernel sees, C-contiguous, shaped."""
        return self.storage[self.guard : self.guard + self.count].reshape(self.shape)

    @property
    def fill_byte(self) -> int:
        return _INPUT_PAD_BYTE if self.arg.intent == "in" else _SENTINEL_BYTE

    def fill_guards(self) -> None:
        raw = self.storage.view(np.uint8)
        guard_bytes = self.guard * self.storage.itemsize
        raw[:guard_bytes] = self.fill_byte
        raw[raw.size - guard_bytes :] = self.fill_byte

    def guard_hit(self) -> str | None:
        """"before" or "after" if that guard no longer holds its fill, else None."""
        raw = self.storage.view(np.uint8)
        guard_bytes = self.guard * self.storage.itemsize
        if np.any(raw[:guard_bytes] != self.fill_byte):
            return "before"
        if np.any(raw[raw.size - guard_bytes :] != self.fill_byte):
            return "after"
        return None


@dataclass(frozen=True)
class Problem:
    """Inputs and outputs of one run of a kernel, with copies of what was passed in.

    `refill` gives the same buffers new inputs and new poison (the next timed run);
    `poison` holds what each output was poisoned with before the run."""

    spec: KernelSpec
    size: ProblemSize
    dtype: str
    buffers: tuple[GuardedBuffer, ...]
    scalars: Mapping[str, int]
    originals: Mapping[str, np.ndarray]  # inputs (in, inout) as first given to the kernel
    seed: int | None = None  # the inputs are a function of it (see compute_expected)
    poison: dict[str, np.ndarray] = field(default_factory=dict)

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

    def refill(self, seed: int) -> Problem:
        """The same buffers with new inputs from `seed` and fresh poison."""
        problem = self.drawn(seed)
        problem.write()
        return problem

    def drawn(self, seed: int) -> Problem:
        """The same buffers with new inputs and poison from `seed`, not yet written to
        them (`write`): the judge draws ahead, while nothing is timed, and writes just
        before the run."""
        rng = np.random.default_rng(seed)
        originals = {b.arg.name: _initial_values(self.spec, b.arg, b.shape, b.storage.dtype,
                                                 rng)
                     for b in self.buffers if b.arg.intent in ("in", "inout")}
        poison = {b.arg.name: random_poison(rng, b.count, b.storage.dtype).reshape(b.shape)
                  for b in self.outputs if b.arg.intent == "out"}
        return replace(self, originals=originals, seed=seed, poison=poison)

    def write(self) -> None:
        """Put the inputs into the buffers and poison the outputs (inout buffers get
        their original values)."""
        for buffer in self.buffers:
            name = buffer.arg.name
            if name in self.originals:
                buffer.array[...] = self.originals[name]
            elif name in self.poison:
                buffer.array[...] = self.poison[name]


def make_problem(spec: KernelSpec, size: ProblemSize, dtype: str, seed: int,
                 allocate: Allocate | None = None) -> Problem:
    """Fresh inputs (from `seed`), poisoned outputs, filled guards; `allocate` gives the
    storage of each buffer (default: ordinary memory)."""
    np_dtype = numpy_dtype(dtype)
    sizes = size.as_dict()
    buffers: list[GuardedBuffer] = []
    scalars: dict[str, int] = {}
    for arg in spec.args:
        if arg.kind == "scalar":
            scalars[arg.name] = evaluate_int(arg.value, sizes)
            continue
        buffer = _allocate(spec, arg, sizes, np_dtype, allocate)
        buffer.fill_guards()
        buffers.append(buffer)
    return _fill(spec, size, dtype, seed, tuple(buffers), scalars)


def _fill(spec: KernelSpec, size: ProblemSize, dtype: str, seed: int,
          buffers: tuple[GuardedBuffer, ...], scalars: Mapping[str, int]) -> Problem:
    return Problem(spec, size, dtype, buffers, dict(scalars), {}).refill(seed)


def storage_bytes(spec: KernelSpec, size: ProblemSize, dtype: str) -> list[int]:
    """Bytes of each buffer's guarded storage, in the spec's order."""
    itemsize = numpy_dtype(dtype).itemsize
    sizes = size.as_dict()
    found = []
    for arg in spec.args:
        if arg.kind == "buffer":
            count = int(np.prod([evaluate_int(e, sizes) for e in arg.shape], dtype=np.int64))
            found.append((count + 2 * guard_elements(itemsize)) * itemsize)
    return found


def _allocate(
    spec: KernelSpec, arg: ArgSpec, sizes: Mapping[str, int], np_dtype: np.dtype[Any],
    allocate: Allocate | None,
) -> GuardedBuffer:
    shape = tuple(evaluate_int(expr, sizes) for expr in arg.shape)
    if any(extent < 0 for extent in shape):
        raise CatalogError(spec.folder or spec.name, f"args.{arg.name}.shape",
                           f"negative extent {shape} at sizes {sizes}")
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = (count + 2 * guard_elements(np_dtype.itemsize)) * np_dtype.itemsize
    raw = allocate(nbytes) if allocate is not None else np.empty(nbytes, np.uint8)
    return GuardedBuffer(arg, raw.view(np_dtype), shape)


def _initial_values(
    spec: KernelSpec, arg: ArgSpec, shape: tuple[int, ...], np_dtype: np.dtype[Any],
    rng: np.random.Generator,
) -> np.ndarray:
    if arg.init == "uniform":
        return spread_values(rng, shape, np_dtype)
    if arg.init == "normal":
        return rng.standard_normal(shape).astype(np_dtype)
    if arg.init == "zeros":
        return np.zeros(shape, np_dtype)
    if arg.init == "ones":
        return np.ones(shape, np_dtype)
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


def compute_expected(problem: Problem) -> Expected:
    """spec.reference and the allowed error per element, in float64 over the inputs."""
    spec = problem.spec
    tolerance = tolerance_of(problem)
    names = reference_names(problem)
    values = _per_output(problem, "reference", evaluate(spec.reference, names))
    scales = _per_output(problem, "error_scale", evaluate(spec.error_scale, names))
    epsilon = float_format(numpy_dtype(problem.dtype)).epsilon
    bounds = {n: tolerance * np.abs(s) + epsilon * np.abs(values[n]) + ABS_FLOOR
              for n, s in scales.items()}
    return Expected(values, bounds)


def tolerance_of(problem: Problem) -> float:
    spec = problem.spec
    if problem.dtype not in spec.tolerances:
        raise CatalogError(spec.folder or spec.name, "tolerance",
                           f"no tolerance for {problem.dtype}")
    return float(spec.tolerances[problem.dtype])


def reference_names(problem: Problem) -> dict[str, Any]:
    names: dict[str, Any] = {**problem.size.as_dict(), **problem.scalars}
    names.update({n: a.astype(np.float64) for n, a in problem.originals.items()})
    return names


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
    check_memory(problem)
    for buffer in problem.outputs:
        _check_output(buffer, expected, problem.label, problem.poison.get(buffer.arg.name))


def check_memory(problem: Problem) -> None:
    """Guards intact and inputs unchanged (outputs are judged by value: an element left
    holding its poison is wrong, and named so, see _check_output)."""
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


def _unwritten(buffer: GuardedBuffer, poison: np.ndarray | None, off: np.ndarray) -> str:
    """A message if every element off still holds its poison, else ""."""
    if poison is None:
        return ""
    kind = f"u{buffer.storage.itemsize}"
    left = (buffer.array.view(kind) == poison.view(kind)) & off
    if int(left.sum()) != int(off.sum()):
        return ""
    first = _index(buffer.arg.name, np.unravel_index(int(np.argmax(left)), left.shape))
    return (f"output {buffer.arg.name} not written (poison left) at {{at}}: "
            f"{int(left.sum())} of {left.size} elements, first {first}")


def _check_output(buffer: GuardedBuffer, expected: Expected, at: str,
                  poison: np.ndarray | None = None) -> None:
    name = buffer.arg.name
    out = buffer.array.astype(np.float64)
    error = np.abs(out - expected.values[name])
    bound = expected.bounds[name]
    off = ~(error <= bound)  # inf and nan errors count as off
    if not off.any():
        return
    unwritten = _unwritten(buffer, poison, off)
    if unwritten:
        raise WrongResult(unwritten.format(at=at))
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
