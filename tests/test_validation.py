"""Backend-neutral validation: each way a run can be wrong gives its own message."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from peak_tune.catalog.loaders import load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import InvalidPoint, UserError, WrongResult
from peak_tune.evaluation.projections import check_projected, project_expected
from peak_tune.evaluation.validation import (
    OutOfBounds,
    Problem,
    applicable_sizes,
    check_outputs,
    compute_expected,
    guard_elements,
    make_problem,
    require_size_constraints,
)

ROOT = Path(__file__).resolve().parents[1]
ODD = ProblemSize.of({"M": 7, "N": 5, "K": 9})


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


def solve(problem: Problem) -> None:
    """What a correct kernel does, in the problem's dtype."""
    arrays = problem.arrays()
    np.matmul(arrays["A"], arrays["B"], out=arrays["C"])


def test_fresh_problem_is_poisoned_and_guarded(spec: KernelSpec) -> None:
    problem = make_problem(spec, ODD, "float32", seed=1)
    arrays = problem.arrays()
    assert arrays["A"].shape == (7, 9) and arrays["C"].shape == (7, 5)
    assert arrays["A"].dtype == np.float32 and arrays["A"].flags.c_contiguous
    assert problem.poison["C"].shape == (7, 5)
    magnitudes = np.abs(arrays["A"])
    assert (arrays["A"] < 0).any() and magnitudes.min() >= 1 / 16 and magnitudes.max() < 16
    assert all(b.guard_hit() is None for b in problem.buffers)
    assert np.isnan(problem.buffer("A").storage[: guard_elements(4)]).all()  # input pads
    assert problem.call_values()[3:] == [7, 5, 9]
    other = make_problem(spec, ODD, "float32", seed=2)
    assert not np.array_equal(arrays["A"], other.arrays()["A"])


def test_correct_run_passes(spec: KernelSpec) -> None:
    for dtype in ("float32", "float64"):
        problem = make_problem(spec, ODD, dtype, seed=3)
        expected = compute_expected(problem)
        solve(problem)
        check_outputs(problem, expected)


def test_tolerance_depends_on_dtype(spec: KernelSpec) -> None:
    """An error of 1e-6 of the scale is rounding in float32 but a bug in float64."""
    for dtype, passes in (("float32", True), ("float64", False)):
        problem = make_problem(spec, ODD, dtype, seed=4)
        expected = compute_expected(problem)
        solve(problem)
        scale = expected.bounds["C"][2, 3] / spec.tolerances[dtype]  # ~ |A| @ |B| there
        problem.arrays()["C"][2, 3] += 1e-6 * scale
        if passes:
            check_outputs(problem, expected)
        else:
            with pytest.raises(WrongResult, match=r"1 of 35 elements off, worst C\[2,3\]"):
                check_outputs(problem, expected)


def test_write_before_a_buffer_hits_its_guard(spec: KernelSpec) -> None:
    problem = make_problem(spec, ODD, "float32", seed=5)
    expected = compute_expected(problem)
    solve(problem)
    problem.buffer("B").storage[guard_elements(4) - 1] = 0.0
    with pytest.raises(OutOfBounds, match="wrote out of bounds: guard before B changed at 7x5x9"):
        check_outputs(problem, expected)


def test_poison_left_and_changed_input_are_named(spec: KernelSpec) -> None:
    problem = make_problem(spec, ODD, "float32", seed=6)
    expected = compute_expected(problem)
    solve(problem)
    problem.arrays()["C"][6, 4] = problem.poison["C"][6, 4]
    with pytest.raises(WrongResult, match=r"output C not written \(poison left\) at 7x5x9"):
        check_outputs(problem, expected)
    solve(problem)
    problem.arrays()["B"][0, 0] += 1.0
    with pytest.raises(WrongResult, match="input B changed by the kernel at 7x5x9"):
        check_outputs(problem, expected)


def test_unknown_dtype_is_a_user_error(spec: KernelSpec) -> None:
    with pytest.raises(UserError, match="unknown dtype 'int3'"):
        make_problem(spec, ODD, "int3", seed=0)


def test_declared_size_constraints_pick_the_sizes(spec: KernelSpec) -> None:
    context = KernelContext(kernel="matmul", backend="c", source="", entry="matmul",
                            size_constraints=("M % TILE == 0",))
    sizes = (ODD, ProblemSize.of({"M": 16, "N": 5, "K": 9}))
    assert applicable_sizes(context, {"TILE": 8}, sizes) == sizes[1:]
    with pytest.raises(InvalidPoint, match="M % TILE == 0"):
        require_size_constraints(context, {"TILE": 8}, ODD)


def test_poison_differs_between_runs(spec: KernelSpec) -> None:
    """A kernel cannot recognise the poison: it is random, and new for each run."""
    first = make_problem(spec, ODD, "float32", seed=7)
    second = first.refill(8)
    assert not np.array_equal(first.poison["C"].view(np.uint32),
                              second.poison["C"].view(np.uint32))
    assert not np.array_equal(first.originals["A"], second.originals["A"])
    assert np.isfinite(second.arrays()["C"]).sum() > 0  # not one NaN pattern


BIG = ProblemSize.of({"M": 96, "N": 80, "K": 512})


def _tf32(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x1000) & 0xFFFFE000).view(np.float32)


def test_low_precision_arithmetic_fails_the_fp32_tolerance(spec: KernelSpec) -> None:
    """TF32 inputs (10-bit mantissas) or an fp16 accumulator are off by more than fp32
    rounding: the full check and the projections both reject them; fp32 passes both."""
    problem = make_problem(spec, BIG, "float32", seed=9)
    expected, projections = compute_expected(problem), project_expected(problem, 10)
    a, b, c = problem.arrays()["A"], problem.arrays()["B"], problem.arrays()["C"]
    c[...] = a @ b
    check_outputs(problem, expected)
    check_projected(problem, projections)
    for cheat in (_tf32(a) @ _tf32(b), (a.astype(np.float16) @ b.astype(np.float16))):
        c[...] = cheat
        with pytest.raises(WrongResult, match="elements off"):
            check_outputs(problem, expected)
        with pytest.raises(WrongResult, match="elements off"):
            check_projected(problem, projections)  # names the elements when it fails


def test_projection_catches_skipped_rows(spec: KernelSpec) -> None:
    problem = make_problem(spec, BIG, "float32", seed=11)
    projections = project_expected(problem, 12)
    a, b, c = problem.arrays()["A"], problem.arrays()["B"], problem.arrays()["C"]
    c[...] = a @ b
    c[40] = c[39]  # one row copied from its neighbour instead of computed
    with pytest.raises(WrongResult, match="1 of 7680 elements off|80 of 7680 elements off"):
        check_projected(problem, projections)


def test_bfloat16_is_checked_in_its_own_precision(spec: KernelSpec) -> None:
    """bf16 inputs and outputs with fp32 accumulation pass; fp8 inputs and a bf16
    accumulator (partial sums rounded every 4 steps of K: 65-85 of 7680 elements off over
    8 seeds; rounded every 16 steps, 0-1 at K = 512, which the check at the tuned size's
    larger K rejects) fail."""
    problem = make_problem(spec, BIG, "bfloat16", seed=11)
    a, b, c = (problem.arrays()[n] for n in ("A", "B", "C"))
    assert a.dtype.name == "bfloat16" and np.all(np.isfinite(a.astype(np.float32)))
    assert (a.astype(np.float32) < 0).any()  # signed, spread over magnitudes
    expected = compute_expected(problem)
    wide_a, wide_b = a.astype(np.float32), b.astype(np.float32)
    c[...] = (wide_a @ wide_b).astype(c.dtype)
    check_outputs(problem, expected)
    narrow = ml_dtypes.float8_e4m3fn
    partial = np.zeros(c.shape, np.float32)
    for k in range(0, wide_a.shape[1], 4):
        partial = (partial + wide_a[:, k:k + 4] @ wide_b[k:k + 4]).astype(
            c.dtype).astype(np.float32)
    for cheat in ((wide_a.astype(narrow).astype(np.float32)
                   @ wide_b.astype(narrow).astype(np.float32)), partial):
        c[...] = cheat.astype(c.dtype)
        with pytest.raises(WrongResult, match="elements off"):
            check_outputs(problem, expected)
