"""A small safe evaluator for catalog expressions (no `eval`).

Integer expressions ("2*M*N*K", "M % MR == 0", "ceil_div(M, BM)") and numpy
expressions over named arrays ("A @ B", "abs(A) @ abs(B)") share one walker over
Python's `ast`, restricted to arithmetic, comparisons, boolean logic and a few functions.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from peak_tune.errors import ExpressionError

__all__ = ["evaluate", "evaluate_int", "evaluate_bool", "names_in", "check_expression"]

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.MatMult: operator.matmul,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": lambda a, b: -(-a // b),
    "log2": math.log2,
    "sqrt": np.sqrt,
    "transpose": np.transpose,
    "sum": np.sum,
    # array functions for references beyond matmul (softmax, layer norm, attention)
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "amax": np.amax,
    "amin": np.amin,
    "mean": np.mean,
    "var": np.var,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "where": np.where,
    "swapaxes": np.swapaxes,
    "softmax": lambda x, axis=-1: _softmax(x, axis),
}
# keyword arguments an array function may take, as constants: a reduction's axis, and
# whether it keeps the reduced axis (softmax's max and sum along the last axis)
_KEYWORDS = frozenset({"axis", "keepdims"})
_ARRAY_FUNCTIONS = frozenset({"sum", "amax", "amin", "mean", "var", "softmax"})


def _softmax(x: Any, axis: int) -> Any:
    shifted = np.exp(x - np.amax(x, axis=axis, keepdims=True))
    return shifted / np.sum(shifted, axis=axis, keepdims=True)


def _walk(node: ast.AST, names: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Expression):
        return _walk(node.body, names, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExpressionError(f"unknown name {node.id!r} in expression {text!r}")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _walk(node.left, names, text)
        right = _walk(node.right, names, text)
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ExpressionError(f"division by zero in expression {text!r}") from exc
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand, names, text))
    if isinstance(node, ast.BoolOp):
        values = (_walk(v, names, text) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _walk(node.left, names, text)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _COMPARE:
                break
            right = _walk(comparator, names, text)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        else:
            return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and (not node.keywords or node.func.id in _ARRAY_FUNCTIONS)
    ):
        args = [_walk(a, names, text) for a in node.args]
        return _FUNCTIONS[node.func.id](*args, **_keywords(node, text))
    raise ExpressionError(f"unsupported syntax {ast.dump(node)[:40]!r} in expression {text!r}")


def _keywords(node: ast.Call, text: str) -> dict[str, Any]:
    """`axis=` (an integer or a tuple of them) and `keepdims=` (a bool), as constants."""
    found: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg not in _KEYWORDS:
            raise ExpressionError(f"unsupported keyword {keyword.arg!r} in expression {text!r}")
        value = _walk(keyword.value, {}, text) if not isinstance(keyword.value, ast.Tuple) \
            else tuple(_walk(e, {}, text) for e in keyword.value.elts)
        found[keyword.arg] = value
    return found


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> ast.Expression:
    """The expression's tree (kept: the harness evaluates a few expressions per run)."""
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse expression {text!r}: {exc.msg}") from exc


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate `text` with the given names bound (numbers or numpy arrays)."""
    return _walk(_parse(text), names, text)


def evaluate_int(text: str, names: Mapping[str, Any]) -> int:
    value = evaluate(text, names)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ExpressionError(f"expression {text!r} gave {value!r}, expected an integer")
    return value


def evaluate_bool(text: str, names: Mapping[str, Any]) -> bool:
    return bool(evaluate(text, names))


def names_in(text: str) -> set[str]:
    """Free names of an expression (function names excluded)."""
    tree = _parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    called = {c.func.id for c in calls if isinstance(c.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called


def check_expression(text: str, allowed: set[str]) -> None:
    """Raise ExpressionError unless `text` parses and uses only `allowed` names."""
    unknown = names_in(text) - allowed
    if unknown:
        raise ExpressionError(f"unknown name(s) {sorted(unknown)} in expression {text!r}")
