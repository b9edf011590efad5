"""Lift the naive seed (seeds/matmul/naive.c) into the loop-nest IR.

The seed is read, not recognised by its text: the three `for` loops give the loop
order (a loop bounded by M runs over i, by N over j, by K over k), and the body must be
the dot-product accumulation `acc += A[i * K + k] * B[k * N + j]` with the store
`C[i * N + j] = acc` after the k loop. Anything else is not a seed this applier can lift.
"""

from __future__ import annotations

import re

from peak_tune.errors import ApplyError

from .ir import Loop, Nest

__all__ = ["lift_seed"]

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_SIGNATURE = re.compile(
    r"void\s+(?P<entry>\w+)\s*\(\s*const\s+DTYPE\s*\*\s*A\s*,\s*const\s+DTYPE\s*\*\s*B\s*,"
    r"\s*DTYPE\s*\*\s*C\s*,\s*int\s+M\s*,\s*int\s+N\s*,\s*int\s+K\s*\)"
)
_FOR = re.compile(r"for\s*\(\s*int\s+(\w+)\s*=\s*0\s*;\s*(\w+)\s*<\s*(\w+)\s*;\s*(\w+)\s*\+\+\s*\)")
_ACCUMULATE = re.compile(
    r"(\w+)\s*\+=\s*A\s*\[\s*(\w+)\s*\*\s*K\s*\+\s*(\w+)\s*\]\s*\*\s*"
    r"B\s*\[\s*(\w+)\s*\*\s*N\s*\+\s*(\w+)\s*\]\s*;"
)
_STORE = re.compile(r"C\s*\[\s*(\w+)\s*\*\s*N\s*\+\s*(\w+)\s*\]\s*=\s*(\w+)\s*;")
_INIT = re.compile(r"DTYPE\s+(\w+)\s*=\s*0\s*;")
_BOUND_DIM = {"M": "i", "N": "j", "K": "k"}


def lift_seed(source: str, entry: str) -> Nest:
    """The nest of a naive matmul seed; ApplyError naming what does not match."""
    text = _COMMENTS.sub(" ", source)
    signature = _SIGNATURE.search(text)
    if not signature or signature.group("entry") != entry:
        raise ApplyError(
            f"seed does not define `void {entry}(const DTYPE *A, const DTYPE *B, DTYPE *C, "
            "int M, int N, int K)`"
        )
    loops = _FOR.findall(text)
    if len(loops) != 3:
        raise ApplyError(f"seed has {len(loops)} for loops, the naive matmul has 3")
    var_dim: dict[str, str] = {}
    for var, cond_var, bound, inc_var in loops:
        if not var == cond_var == inc_var or bound not in _BOUND_DIM:
            raise ApplyError(f"seed loop over {var!r} is not `for (int v = 0; v < M|N|K; v++)`")
        var_dim[var] = _BOUND_DIM[bound]
    if sorted(var_dim.values()) != ["i", "j", "k"]:
        raise ApplyError("seed loops do not run over M, N and K once each")
    _check_body(text, {dim: var for var, dim in var_dim.items()})
    order = [var_dim[var] for var, *_ in loops]
    if order[-1] != "k":
        raise ApplyError("seed's innermost loop must be the k loop (dot-product form)")
    return Nest(loops=tuple(Loop(dim, "point") for dim in order))


def _check_body(text: str, var: dict[str, str]) -> None:
    accumulate = _ACCUMULATE.search(text)
    store = _STORE.search(text)
    init = _INIT.search(text)
    if not accumulate or not store or not init:
        raise ApplyError("seed body is not `acc = 0; acc += A[i*K+k] * B[k*N+j]; C[i*N+j] = acc`")
    acc, a_row, a_col, b_row, b_col = accumulate.groups()
    if (a_row, a_col, b_row, b_col) != (var["i"], var["k"], var["k"], var["j"]):
        raise ApplyError("seed accumulates A and B with subscripts other than A[i][k] * B[k][j]")
    if store.groups() != (var["i"], var["j"], acc) or init.group(1) != acc:
        raise ApplyError("seed does not store its accumulator to C[i][j]")
    if store.start() < accumulate.end():
        raise ApplyError("seed stores C before it accumulates")
