"""The CUDA worker's validation data kept on the device, and the checks run there.

The first check of a (spec, size, dtype, seed) builds its inputs with
validation.make_problem and its float64 reference with compute_expected, exactly as a
host backend would, and uploads them once (a `Reference`): each buffer's pristine guarded
storage (inputs, sentinel guards, NaN-poisoned outputs), and per output the expected
values and the allowed error per element, in float64. Every check copies the pristine
storage device to device into fresh allocations, so each run starts from the same
guarded, poisoned state as a freshly generated problem; after the run the device
compares the guards and the inputs with the pristine bytes and each output with
|out - expected| <= bound (NaN fails), and only a few counts come back. The caller
downloads the run and lets validation.check_outputs name a failure in its usual words.

A stray write could land in the cached arrays themselves: every check also sums each
cached array (as unsigned words) and compares with the sums taken at upload, so a changed
reference is reported, never trusted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.core import ArgSpec, KernelSpec, ProblemSize
from peak_tune.validation import (
    GUARD_ELEMENTS,
    Expected,
    Problem,
    compute_expected,
    make_problem,
    size_label,
)

__all__ = ["REFERENCE_BUDGET_BYTES", "Reference", "ReferenceCache", "failure_count", "upload"]

_log = logging.getLogger(__name__)

REFERENCE_BUDGET_BYTES = 8 << 30  # device bytes of references kept; the oldest go first


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


def _word_sums(arrays: list[Any]) -> Any:
    """Per array, the sum of its elements read as unsigned words (wrapping), on the device."""
    import cupy

    sums = [cupy.sum(a.view(f"uint{8 * a.itemsize}"), dtype=cupy.uint64) for a in arrays]
    return cupy.stack(sums) if sums else cupy.zeros(0, cupy.uint64)


def upload(problem: Problem, expected: Expected | None) -> Reference:
    """The problem's guarded buffers on the device; with `expected`, its values, bounds
    and the word sums of everything uploaded (None: copies alone, no device kernels)."""
    import cupy

    pristine = {b.arg.name: cupy.asarray(b.storage) for b in problem.buffers}
    shapes = {b.arg.name: b.shape for b in problem.buffers}
    values: dict[str, Any] = {}
    bounds: dict[str, Any] = {}
    if expected is not None:
        values = {n: cupy.asarray(np.ascontiguousarray(v).ravel())
                  for n, v in expected.values.items()}
        bounds = {n: cupy.asarray(np.ascontiguousarray(v).ravel())
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
        reference = upload(problem, compute_expected(problem))
        self.entries[key] = reference
        while len(self.entries) > 1 and self.nbytes > self.budget_bytes:
            self.entries.popitem(last=False)
        _log.debug("reference %s seed %d on the device (%d MiB cached)", reference.label,
                   seed, self.nbytes >> 20)
        return reference

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.entries.values())

    def changed(self) -> Any:
        """How many cached arrays no longer hold what was uploaded (a device scalar)."""
        import cupy

        counts = [cupy.count_nonzero(_word_sums(r.arrays()) != r.sums)
                  for r in self.entries.values()]
        return sum(counts[1:], counts[0]) if counts else cupy.zeros((), cupy.int64)

    def clear(self) -> None:
        self.entries.clear()


def failure_count(reference: Reference, storage: dict[str, Any]) -> Any:
    """Bytes and elements that fail the checks of validation.check_outputs, counted on the
    device (a scalar): guards changed, inputs changed, outputs off or NaN."""
    import cupy

    counts = []
    for arg in reference.buffers:
        raw = storage[arg.name].view(cupy.uint8)
        pristine = reference.pristine[arg.name].view(cupy.uint8)
        if arg.intent == "in":  # guards and contents alike
            counts.append(cupy.count_nonzero(raw != pristine))
            continue
        guard = GUARD_ELEMENTS * storage[arg.name].itemsize
        counts.append(cupy.count_nonzero(raw[:guard] != pristine[:guard]))
        counts.append(cupy.count_nonzero(raw[-guard:] != pristine[-guard:]))
        count = int(np.prod(reference.shapes[arg.name], dtype=np.int64))
        out = storage[arg.name][GUARD_ELEMENTS:GUARD_ELEMENTS + count].astype(cupy.float64)
        error = cupy.abs(out - reference.expected[arg.name])
        counts.append(cupy.count_nonzero(~(error <= reference.bounds[arg.name])))
    return sum(counts[1:], counts[0]) if counts else cupy.zeros((), cupy.int64)
