"""Checks of a run by random projections of its output, where the spec declares its
reference linear in an input (`projection`): C v against A (B v), u C against (u A) B,
in O(n^2) rather than the full reference's O(n^3), which is what makes checking every
timed run affordable. The bound is statistical: the per-element tolerance over the
root-sum-square of the projected terms, so arithmetic that is wrong by more than the
tolerance in most elements (TF32, fp16 accumulation, skipped work) fails it as it fails
the full check (peak_tune.evaluation.validation), which then names the elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from peak_tune.core import KernelSpec
from peak_tune.errors import WrongResult
from peak_tune.evaluation.validation import (
    ABS_FLOOR,
    Problem,
    check_memory,
    check_outputs,
    compute_expected,
    numpy_dtype,
    reference_names,
    tolerance_of,
)
from peak_tune.expr import evaluate
from peak_tune.harness.values import float_format

__all__ = ["Projection", "check_projected", "project_expected", "projectable"]


@dataclass(frozen=True)
class Projection:
    """One random projection of a problem's output and what the reference gives for it.

    side "right": `vector` runs over the output's last axis (C v); "left": over the
    second-to-last (u C). `expected` is the reference's projection, `bound` the allowed
    error of each projected element before the output-rounding term."""

    output: str
    side: str
    vector: np.ndarray
    expected: np.ndarray
    bound: np.ndarray

    def project(self, out: np.ndarray) -> np.ndarray:
        if self.side == "right":
            return out @ self.vector
        return np.swapaxes(out, -1, -2) @ self.vector


def projectable(spec: KernelSpec) -> bool:
    """Whether the spec declares projections its outputs can be checked with."""
    outputs = [a for a in spec.args if a.kind == "buffer" and a.intent != "in"]
    return bool(spec.projection) and len(outputs) == 1 and len(outputs[0].shape) >= 2


def project_expected(problem: Problem, seed: int,
                     one_side: bool = False) -> tuple[Projection, ...]:
    """The reference's projections for `problem` (spec.projection: side -> input the
    reference is linear in), with random +-1 vectors from `seed`. O(n^2) for matmul.
    `one_side`: only one of the declared sides, chosen at random (half the cost: either
    side sees an error in any element)."""
    spec = problem.spec
    rng = np.random.default_rng(seed)
    (output,) = problem.outputs
    tolerance = tolerance_of(problem)
    sides = sorted(spec.projection.items())
    if one_side:
        sides = [sides[int(rng.integers(len(sides)))]]
    names = reference_names(problem)
    found = []
    for side, input_name in sides:
        extent = output.shape[-1] if side == "right" else output.shape[-2]
        vector = rng.choice(np.array([-1.0, 1.0]), extent)
        ones = np.ones(extent)
        data = names[input_name]
        projected = dict(names)
        projected[input_name] = _apply(side, data, vector)
        expected = _squeeze(side, evaluate(spec.reference, projected))
        projected[input_name] = _apply(side, np.abs(data), ones)
        scale = _squeeze(side, evaluate(spec.error_scale, projected))
        # root-sum-square of the per-element bounds, from their sum (all terms alike)
        bound = tolerance * np.abs(scale) / np.sqrt(extent) + ABS_FLOOR
        found.append(Projection(output.arg.name, side, vector, expected, bound))
    return tuple(found)


def _apply(side: str, data: np.ndarray, vector: np.ndarray) -> np.ndarray:
    if side == "right":
        return data @ vector[:, None]
    return vector[None, :] @ data


def _squeeze(side: str, value: Any) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    return array[..., 0] if side == "right" else array[..., 0, :]


def check_projected(problem: Problem, projections: tuple[Projection, ...]) -> None:
    """Raise WrongResult unless every projection of the output matches the reference's.
    A failure is named element by element by the full check where that finds it."""
    check_memory(problem)
    epsilon = float_format(numpy_dtype(problem.dtype)).epsilon
    converted: dict[str, np.ndarray] = {}
    for projection in projections:
        if projection.output not in converted:
            converted[projection.output] = problem.buffer(projection.output).array.astype(
                np.float64)
        out = converted[projection.output]
        got = projection.project(out)
        rounding = 2 * epsilon * np.sqrt(_sum_squares(projection.side, out))
        error = np.abs(got - projection.expected)
        off = ~(error <= projection.bound + rounding)
        if off.any():
            check_outputs(problem, compute_expected(problem))  # names the elements
            ratio = np.nan_to_num(error / (projection.bound + rounding), nan=np.inf)
            axis = "rows" if projection.side == "right" else "columns"
            raise WrongResult(
                f"wrong result at {problem.label}: {int(off.sum())} of {off.size} "
                f"{axis} of {projection.output} off in a random projection "
                f"(worst {float(ratio.max()):.3g} x the allowed error)")


def _sum_squares(side: str, out: np.ndarray) -> np.ndarray:
    return np.einsum("...ij,...ij->...i" if side == "right" else "...ij,...ij->...j",
                     out, out)
