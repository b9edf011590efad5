"""Strict reading of a model's reply: one fenced block, the entry point's signature
kept, every declared tuning parameter present, launch expressions that parse."""

from __future__ import annotations

import json
import re

from peak_tune.errors import ExpressionError
from peak_tune.expr import check_expression

from .errors import BadLaunchError, MissingParameterError, NoCodeError, ScopeError
from .prompts import LAUNCH_KEYS

__all__ = ["code_block", "entry_signature", "require_params", "require_signature",
           "parse_launch"]

_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)```", re.DOTALL | re.MULTILINE)
_QUALIFIERS = re.compile(r"\b(restrict|__restrict__|__restrict)\b")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")


def code_block(reply: str) -> str:
    """The text of the reply's one fenced code block; NoCodeError otherwise."""
    blocks = _FENCE.findall(reply)
    if not blocks:
        raise NoCodeError(f"the reply has no fenced code block: {_snippet(reply)}")
    if len(blocks) > 1:
        raise NoCodeError(f"the reply has {len(blocks)} fenced code blocks, expected one")
    text: str = blocks[0]
    if not text.strip():
        raise NoCodeError("the reply's code block is empty")
    return text


def entry_signature(source: str, entry: str) -> str | None:
    """The entry point's prototype normalised for whitespace (`restrict` qualifiers and
    `__launch_bounds__` left out: transformations may add them), or None if absent."""
    pattern = re.compile(
        r"((?:extern\s+\"C\"\s+)?(?:__global__\s+)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?)"
        + re.escape(entry) + r"\s*\(([^)]*)\)\s*\{"
    )
    found = pattern.search(source)
    if found is None:
        return None
    prefix = _LAUNCH_BOUNDS.sub(" ", found.group(1))
    params = [_normalised(_QUALIFIERS.sub(" ", p)) for p in found.group(2).split(",")]
    return f"{_normalised(prefix)} {entry}({', '.join(params)})"


def require_signature(parent_source: str, child_source: str, entry: str) -> None:
    """ScopeError unless the child defines the entry point as the parent does."""
    before = entry_signature(parent_source, entry)
    after = entry_signature(child_source, entry)
    if before is None:
        return  # the parent's form is not one this check knows: nothing to compare
    if after is None:
        raise ScopeError(f"the edited code no longer defines the entry point {entry!r} "
                         f"as `{before}`")
    if after != before:
        raise ScopeError(f"the entry point's signature changed from `{before}` to `{after}`")


def require_params(source: str, names: tuple[str, ...]) -> None:
    """MissingParameterError naming every parameter that never appears in `source`."""
    missing = [n for n in names if not re.search(rf"\b{re.escape(n)}\b", source)]
    if missing:
        raise MissingParameterError(
            f"tuning parameter(s) {', '.join(missing)} never appear in the edited code")


def parse_launch(reply: str, allowed: set[str], keys: tuple[str, ...] = LAUNCH_KEYS,
                 required: tuple[str, ...] = ("grid_x", "block_x")) -> dict[str, str]:
    """The launch geometry of a reply: a JSON object of expressions over `allowed`, with
    the `keys` a launch of its backend may have and the `required` ones."""
    text = code_block(reply)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLaunchError(f"the launch reply is not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise BadLaunchError("the launch reply is not a JSON object")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise BadLaunchError(f"unknown launch key(s) {unknown}")
    missing = [k for k in required if k not in data]
    if missing:
        raise BadLaunchError(f"the launch reply lacks {', '.join(missing)}")
    launch: dict[str, str] = {}
    for key in keys:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise BadLaunchError(f"launch {key} is {value!r}, expected an expression string")
        try:
            check_expression(str(value), allowed)
        except ExpressionError as exc:
            raise BadLaunchError(f"launch {key}: {exc}") from exc
        launch[key] = str(value)
    return launch


def _normalised(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s*([*&(),])\s*", r"\1", text).replace("*", " *").replace("  ", " ")


def _snippet(text: str) -> str:
    line = " ".join(text.split())
    return repr(line[:120] + ("..." if len(line) > 120 else ""))
