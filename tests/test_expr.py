import numpy as np
import pytest

from peak_tune.errors import ExpressionError
from peak_tune.expr import check_expression, evaluate, evaluate_bool, evaluate_int, names_in


def test_integer_arithmetic_and_functions():
    assert evaluate_int("2 * M * N * K", {"M": 4, "N": 5, "K": 6}) == 240
    assert evaluate_int("ceil_div(M, 32) * 32", {"M": 33}) == 64
    assert evaluate_int("max(M, N) // 2", {"M": 8, "N": 10}) == 5


def test_constraints_evaluate_to_booleans():
    assert evaluate_bool("MC % MR == 0 and KC >= 16", {"MC": 64, "MR": 8, "KC": 16})
    assert not evaluate_bool("MC % MR == 0", {"MC": 64, "MR": 6})
    assert evaluate_bool("1 <= MR < 16", {"MR": 4})


def test_numpy_reference_expression():
    a = np.arange(6.0).reshape(2, 3)
    b = np.ones((3, 2))
    np.testing.assert_array_equal(evaluate("A @ B", {"A": a, "B": b}), a @ b)
    np.testing.assert_array_equal(evaluate("abs(A) @ abs(B)", {"A": -a, "B": b}), a @ b)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "M.__class__",
        "[x for x in M]",
        "lambda: 1",
        "M if 1 else 2",
    ],
)
def test_anything_beyond_arithmetic_is_refused(text):
    with pytest.raises(ExpressionError):
        evaluate(text, {"M": 3})


def test_unknown_names_and_bad_syntax_are_clear():
    with pytest.raises(ExpressionError, match="unknown name 'Q'"):
        evaluate_int("Q + 1", {"M": 1})
    with pytest.raises(ExpressionError, match="cannot parse"):
        evaluate_int("M +", {"M": 1})
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate_int("M // 0", {"M": 1})
    with pytest.raises(ExpressionError, match="expected an integer"):
        evaluate_int("M / 2", {"M": 3})


def test_names_in_excludes_functions():
    assert names_in("min(MC, M) + ceil_div(K, KC)") == {"MC", "M", "K", "KC"}
    check_expression("MC % MR == 0", {"MC", "MR"})
    with pytest.raises(ExpressionError, match="MZ"):
        check_expression("MC % MZ == 0", {"MC", "MR"})


def test_references_beyond_matmul_reduce_along_an_axis() -> None:
    import numpy as np

    from peak_tune.expr import evaluate

    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    soft = evaluate("softmax(X, axis=-1)", {"X": x})
    by_hand = evaluate("exp(X - amax(X, axis=-1, keepdims=True)) / "
                       "sum(exp(X - amax(X, axis=-1, keepdims=True)), axis=-1, keepdims=True)",
                       {"X": x})
    assert np.allclose(soft, by_hand) and np.allclose(soft.sum(axis=-1), 1.0)
    assert np.allclose(soft[1], 1 / 3)
    norm = evaluate("(X - mean(X, axis=-1, keepdims=True)) / "
                    "sqrt(var(X, axis=-1, keepdims=True) + 1e-5)", {"X": x})
    assert np.allclose(norm.mean(axis=-1), 0.0)
    q = np.eye(2)[None]
    attention = evaluate("softmax(Q @ swapaxes(K, -1, -2) / sqrt(2)) @ V",
                         {"Q": q, "K": q, "V": q})
    assert attention.shape == (1, 2, 2)


def test_only_an_axis_and_keepdims_may_be_named_and_only_for_array_functions() -> None:
    import numpy as np
    import pytest

    from peak_tune.errors import ExpressionError
    from peak_tune.expr import evaluate

    with pytest.raises(ExpressionError, match="unsupported keyword 'out'"):
        evaluate("sum(X, out=X)", {"X": np.ones(2)})
    with pytest.raises(ExpressionError, match="unsupported syntax"):
        evaluate("ceil_div(M, b=2)", {"M": 4})
