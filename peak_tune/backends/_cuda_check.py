"""The CUDA worker's validation data kept on the device, and the checks run there.

The first check of a (spec, size, dtype, seed) builds its inputs with
validation.make_problem, exactly as a host backend would, and uploads them once (a
`Reference`): each buffer's pristine guarded storage (inputs, NaN input pads, sentinel
output guards, poisoned outputs), and per output the float64 reference and the allowed
error per element, computed on the device (`expected_on_device`). Every check copies
the pristine storage device to device into fresh allocations, so each run starts from
the same guarded, poisoned state as a freshly generated problem; after the run the
device compares the guards and the inputs with the pristine bytes and each output with
|out - expected| <= bound (NaN fails), in fused reductions, and only a few counts come
back. The caller downloads a failed run and lets validation.check_outputs name the
failure in its usual words. The seeds are the worker's secret (see _cuda_device).

A stray write could land in the cached arrays themselves: every check also sums each
cached array (as unsigned words) and compares with the sums taken at upload, so a changed
reference is reported, never trusted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.core import ArgSpec, KernelSpec, ProblemSize
from peak_tune.evaluation.validation import (
    Expected,
    Problem,
    compute_expected,
    guard_elements,
    make_problem,
    numpy_dtype,
    size_label,
)
from peak_tune.expr import evaluate
from peak_tune.harness.values import float_format

__all__ = ["REFERENCE_BUDGET_BYTES", "Reference", "ReferenceCache", "failure_count", "upload"]

_log = logging.getLogger(__name__)

REFERENCE_BUDGET_BYTES = 40 << 30  # device bytes of references kept; the oldest go first
# (every timed run has a reference of its own: 7 at 8192 fp32 are 13 GB)


@dataclass(frozen=True)
class Reference:
    """One (spec, size, dtype, seed) on the device, as validation.make_problem made it."""

    spec: KernelSpec
    size: ProblemSize
    dtype: str
    seed: int
    scalars: dict[str, int]
    shapes: dict[str, tuple[int, ...]]  # buffer name -> shape
    pristine: dict[str, Any]  # buffer name -> guarded storage (1-D, guards included)
    expected: dict[str, Any]  # output name -> float64 reference, flat
    bounds: dict[str, Any]  # output name -> allowed absolute error, float64, flat
    sums: Any  # word sums of every array above, taken at upload (None: not checked)

    @property
    def label(self) -> str:
        return size_label(self.spec, self.size)

    @property
    def buffers(self) -> tuple[ArgSpec, ...]:
        return tuple(a for a in self.spec.args if a.kind == "buffer")

    def arrays(self) -> list[Any]:
        return [*self.pristine.values(), *self.expected.values(), *self.bounds.values()]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays())


def device_view(array: np.ndarray) -> np.ndarray:
    """The array as CuPy can hold it: bfloat16 (which CuPy lacks) as its 16-bit words;
    the device kernels and checks read those words as __nv_bfloat16."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def host_float(array: np.ndarray) -> np.ndarray:
    """The array in a type CuPy computes with (bfloat16 widened to float32, exactly)."""
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _word_sums(arrays: list[Any]) -> Any:
    """Per array, the sum of its elements read as unsigned words (wrapping), on the device."""
    import cupy

    sums = [cupy.sum(a.view(f"uint{8 * a.itemsize}"), dtype=cupy.uint64) for a in arrays]
    return cupy.stack(sums) if sums else cupy.zeros(0, cupy.uint64)


def expected_on_device(problem: Problem) -> Expected:
    """compute_expected's float64 reference and bounds, computed on the GPU (cupy arrays:
    seconds on the host at 4096, milliseconds here); the host's where the expression
    needs what cupy lacks."""
    import cupy

    spec = problem.spec
    try:
        names: dict[str, Any] = {**problem.size.as_dict(), **problem.scalars}
        names.update({n: cupy.asarray(host_float(a)).astype(cupy.float64)
                      for n, a in problem.originals.items()})
        values = _outputs(problem, evaluate(spec.reference, names))
        scales = _outputs(problem, evaluate(spec.error_scale, names))
    except (TypeError, ValueError, AttributeError):
        return compute_expected(problem)
    tolerance = float(spec.tolerances[problem.dtype])
    epsilon = float_format(numpy_dtype(problem.dtype)).epsilon
    bounds = {n: tolerance * cupy.abs(v) + epsilon * cupy.abs(values[n]) + 1e-30
              for n, v in scales.items()}
    return Expected(values, bounds)


def _outputs(problem: Problem, result: Any) -> dict[str, Any]:
    import cupy

    results = list(result) if isinstance(result, tuple | list) else [result]
    if len(results) != len(problem.outputs):
        raise ValueError("outputs")
    return {b.arg.name: cupy.ascontiguousarray(cupy.broadcast_to(
        cupy.asarray(r, dtype=cupy.float64), b.shape)) for b, r in zip(problem.outputs,
                                                                         results, strict=True)}


def upload(problem: Problem, expected: Expected | None) -> Reference:
    """The problem's guarded buffers on the device; with `expected`, its values, bounds
    and the word sums of everything uploaded (None: copies alone, no device kernels)."""
    import cupy

    pristine = {b.arg.name: cupy.asarray(device_view(b.storage)) for b in problem.buffers}
    shapes = {b.arg.name: b.shape for b in problem.buffers}
    values: dict[str, Any] = {}
    bounds: dict[str, Any] = {}
    if expected is not None:
        values = {n: cupy.ascontiguousarray(cupy.asarray(v)).ravel()
                  for n, v in expected.values.items()}
        bounds = {n: cupy.ascontiguousarray(cupy.asarray(v)).ravel()
                  for n, v in expected.bounds.items()}
    reference = Reference(problem.spec, problem.size, problem.dtype, int(problem.seed or 0),
                          dict(problem.scalars), shapes, pristine, values, bounds, None)
    if expected is None:
        return reference
    return dataclasses.replace(reference, sums=_word_sums(reference.arrays()))


class ReferenceCache:
    """References by (spec, size, dtype, seed), most recent last, up to a byte budget."""

    def __init__(self, budget_bytes: int = REFERENCE_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[Any, ...], Reference] = OrderedDict()

    def get(self, spec: KernelSpec, size: ProblemSize, dtype: str, seed: int) -> Reference:
        key = (spec.name, spec.args, spec.reference, spec.error_scale,
               tuple(sorted(spec.tolerances.items())), size.values, dtype, seed)
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
            return found
        problem = make_problem(spec, size, dtype, seed)
        reference = upload(problem, expected_on_device(problem))
        self.entries[key] = reference
        while len(self.entries) > 1 and self.nbytes > self.budget_bytes:
            self.entries.popitem(last=False)
        _log.debug("reference %s seed %d on the device (%d MiB cached)", reference.label,
                   seed, self.nbytes >> 20)
        return reference

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.entries.values())

    def changed(self, used: list[Reference] | None = None) -> Any:
        """How many of the cached arrays (of `used`, else all) no longer hold what was
        uploaded (a device scalar)."""
        import cupy

        counts = [cupy.count_nonzero(_word_sums(r.arrays()) != r.sums)
                  for r in (used if used is not None else self.entries.values())]
        return sum(counts[1:], counts[0]) if counts else cupy.zeros((), cupy.int64)

    def clear(self) -> None:
        self.entries.clear()


_COUNTING = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__device__ __forceinline__ void add(unsigned long long local, unsigned long long *count) {
    for (int offset = 16; offset > 0; offset >>= 1)
        local += __shfl_down_sync(0xffffffffu, local, offset);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, local);
}
#define STRIDE for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; \
                     i += (long long)gridDim.x * blockDim.x)
#define DIFFER(NAME, T) extern "C" __global__ void NAME(const T *a, const T *b, long long n, \
        unsigned long long *count) { \
    unsigned long long local = 0; STRIDE local += a[i] != b[i]; add(local, count); }
DIFFER(differ16, unsigned short)
DIFFER(differ32, unsigned int)
DIFFER(differ64, unsigned long long)
extern "C" __global__ void unlike32(const unsigned int *a, unsigned int fill, long long n,
                                    unsigned long long *count) {
    unsigned long long local = 0; STRIDE local += a[i] != fill; add(local, count); }
#define OFF(NAME, T, READ) extern "C" __global__ void NAME(const T *out, \
        const double *expected, const double *bound, long long n, \
        unsigned long long *count) { \
    unsigned long long local = 0; \
    STRIDE local += !(fabs(READ(out[i]) - expected[i]) <= bound[i]); add(local, count); }
#define AS_DOUBLE(x) ((double)(x))
#define HALF_AS_DOUBLE(x) ((double)__half2float(x))
#define BF16_AS_DOUBLE(x) ((double)__bfloat162float(x))
OFF(off16, __half, HALF_AS_DOUBLE)
OFF(offbf16, __nv_bfloat16, BF16_AS_DOUBLE)
OFF(off32, float, AS_DOUBLE)
OFF(off64, double, AS_DOUBLE)
"""
_THREADS = 256
_module: list[Any] = []


def _count(name: str, arrays: tuple[Any, ...], count: Any) -> None:
    """Add to `count` (a device uint64) what kernel `name` counts over the arrays (one
    pass, grid-stride, asynchronous)."""
    import cupy

    if not _module:
        _module.append(cupy.RawModule(code=_COUNTING, options=("-std=c++17",)))
    n = int(arrays[0].size)
    if n == 0:
        return
    blocks = min(-(-n // _THREADS), 4096)
    kernel = _module[0].get_function(name)
    kernel((blocks,), (_THREADS,), (*arrays, np.int64(n), count))


def failure_count(reference: Reference, storage: dict[str, Any], slack: Sequence[Any] = (),
                  slack_fill: int = 0) -> Any:
    """Bytes and elements that fail the checks of validation.check_outputs, counted on the
    device (a uint64 array of one element, not waited for): guards changed, inputs
    changed, outputs off or NaN; and the bytes of `slack` (uint8 arrays of a size in
    whole words) that no longer hold `slack_fill`. A storage may be shorter than the
    pristine's (a fenced one, whose back guard is cut short): its own bytes are compared."""
    import cupy

    count = cupy.zeros(1, cupy.uint64)
    for arg in reference.buffers:
        data = storage[arg.name]
        bits = 8 * data.itemsize
        raw = data.view(f"uint{bits}")
        pristine = reference.pristine[arg.name].view(f"uint{bits}")[:raw.size]
        differ = f"differ{bits}"
        if arg.intent == "in":  # guards and contents alike
            _count(differ, (raw, pristine), count)
            continue
        guard = guard_elements(data.itemsize)
        elements = int(np.prod(reference.shapes[arg.name], dtype=np.int64))
        _count(differ, (raw[:guard], pristine[:guard]), count)
        _count(differ, (raw[guard + elements:], pristine[guard + elements:]), count)
        off = "offbf16" if reference.dtype == "bfloat16" else f"off{bits}"
        _count(off, (data[guard:guard + elements], reference.expected[arg.name],
                     reference.bounds[arg.name]), count)
    word = np.uint32(slack_fill * 0x01010101)
    for part in slack:
        _count("unlike32", (part.view(cupy.uint32), word), count)
    return count[0].astype(cupy.int64)
