"""Backend-neutral validation: each way a run can be wrong gives its own message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from peak_tune.catalog.loaders import load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import InvalidPoint, UserError, WrongResult
from peak_tune.validation import (
    GUARD_ELEMENTS,
    OutOfBounds,
    Problem,
    applicable_sizes,
    check_outputs,
    compute_expected,
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
    assert np.isnan(arrays["C"]).all()
    assert np.abs(arrays["A"]).max() < 1.0
    assert all(b.guard_hit() is None for b in problem.buffers)
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
    problem.buffer("B").storage[GUARD_ELEMENTS - 1] = 0.0
    with pytest.raises(OutOfBounds, match="wrote out of bounds: guard before B changed at 7x5x9"):
        check_outputs(problem, expected)


def test_nan_left_and_changed_input_are_named(spec: KernelSpec) -> None:
    problem = make_problem(spec, ODD, "float32", seed=6)
    expected = compute_expected(problem)
    solve(problem)
    problem.arrays()["C"][6, 4] = np.nan
    with pytest.raises(WrongResult, match=r"output C not written \(NaN left\) at 7x5x9"):
        check_outputs(problem, expected)
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
