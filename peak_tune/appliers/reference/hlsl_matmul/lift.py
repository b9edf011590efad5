"""Lift the naive HLSL seed (seeds/matmul/naive.hlsl) to the NAIVE_HLSL plan.

The seed is read, not recognised by its text: it must bind A, B (read) and C (written)
as structured buffers 0, 1 and 2 with the sizes in push constants, take the output row
from y and the column from x of SV_DispatchThreadID, return outside C, accumulate
`acc += A[row * sizes.K + k] * B[k * sizes.N + col]` over k from 0 to sizes.K in ACC,
and store `C[row * sizes.N + col] = acc`.
"""

from __future__ import annotations

import re

from peak_tune.appliers.reference.cuda_matmul.plan import NAIVE_HLSL, Plan
from peak_tune.errors import ApplyError

__all__ = ["lift_seed"]

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CAST = r"(?:\(\s*ACC\s*\)\s*)?"
_SIZE = r"sizes\s*\.\s*{}"
_BUFFERS = (
    (r"\[\[\s*vk::binding\(\s*0\s*\)\s*\]\]\s*StructuredBuffer\s*<\s*DTYPE\s*>\s*A\s*;", "A at 0"),
    (r"\[\[\s*vk::binding\(\s*1\s*\)\s*\]\]\s*StructuredBuffer\s*<\s*DTYPE\s*>\s*B\s*;", "B at 1"),
    (r"\[\[\s*vk::binding\(\s*2\s*\)\s*\]\]\s*RWStructuredBuffer\s*<\s*DTYPE\s*>\s*C\s*;",
     "C at 2"),
    (r"\[\[\s*vk::push_constant\s*\]\]\s*ConstantBuffer\s*<\s*Sizes\s*>\s*sizes\s*;",
     "push-constant sizes"),
)
_ENTRY = (r"\[\s*numthreads\s*\([^)]*\)\s*\]\s*void\s+(?P<entry>\w+)\s*\(\s*uint3\s+(?P<id>\w+)"
          r"\s*:\s*SV_DispatchThreadID\s*\)")
_INDEX = r"uint\s+(\w+)\s*=\s*{id}\.y\s*,\s*(\w+)\s*=\s*{id}\.x\s*;"
_GUARD = (rf"if\s*\(\s*(\w+)\s*>=\s*{_SIZE.format('M')}\s*\|\|\s*(\w+)\s*>=\s*"
          rf"{_SIZE.format('N')}\s*\)\s*return\s*;")
_INIT = r"ACC\s+(\w+)\s*=\s*0\s*;"
_LOOP = (rf"for\s*\(\s*uint\s+(\w+)\s*=\s*0\s*;\s*(\w+)\s*<\s*{_SIZE.format('K')}\s*;\s*"
         r"(?:\+\+\s*(\w+)|(\w+)\s*\+\+)\s*\)")
_ACCUMULATE = (rf"(\w+)\s*\+=\s*{_CAST}A\s*\[\s*(\w+)\s*\*\s*{_SIZE.format('K')}\s*\+\s*(\w+)"
               rf"\s*\]\s*\*\s*{_CAST}B\s*\[\s*(\w+)\s*\*\s*{_SIZE.format('N')}\s*\+\s*(\w+)"
               r"\s*\]\s*;")
_STORE = (rf"C\s*\[\s*(\w+)\s*\*\s*{_SIZE.format('N')}\s*\+\s*(\w+)\s*\]\s*=\s*"
          r"(?:\(\s*DTYPE\s*\)\s*)?(\w+)\s*;")


def _find(pattern: str, text: str, what: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if not found:
        raise ApplyError(f"seed is not the naive HLSL matmul: no {what}")
    return found


def lift_seed(source: str, entry: str) -> Plan:
    """The plan of the naive one-thread-per-output shader; ApplyError naming what differs."""
    text = _COMMENTS.sub(" ", source)
    for pattern, what in _BUFFERS:
        _find(pattern, text, what)
    head = re.search(_ENTRY, text)
    if not head or head.group("entry") != entry:
        raise ApplyError(f"seed does not define `[numthreads(...)] void {entry}(uint3 id : "
                         "SV_DispatchThreadID)`")
    index = _find(_INDEX.format(id=head.group("id")), text,
                  "`uint row = id.y, col = id.x;` position")
    row, col = index.groups()
    guard = _find(_GUARD, text, "`if (row >= sizes.M || col >= sizes.N) return;` guard")
    if guard.groups() != (row, col):
        raise ApplyError("seed guards other variables than its row and column")
    acc = _find(_INIT, text, "`ACC acc = 0;` accumulator").group(1)
    loop = _find(_LOOP, text, "`for (uint k = 0; k < sizes.K; k++)` loop")
    k = loop.group(1)
    if {v for v in loop.groups()[1:] if v} != {k}:
        raise ApplyError("seed's K loop does not step one variable")
    accumulate = _find(_ACCUMULATE, text,
                       "`acc += A[row * sizes.K + k] * B[k * sizes.N + col]` statement")
    if accumulate.groups() != (acc, row, k, k, col):
        raise ApplyError("seed accumulates something other than A[row][k] * B[k][col]")
    store = _find(_STORE, text, "`C[row * sizes.N + col] = acc` store")
    if store.groups() != (row, col, acc):
        raise ApplyError("seed does not store its accumulator to C[row][col]")
    order = [head.end(), guard.start(), loop.start(), accumulate.start(), store.start()]
    if order != sorted(order) or len(re.findall(r"\bfor\s*\(", text)) != 1:
        raise ApplyError("seed's statements are not guard, K loop, accumulate, store")
    return NAIVE_HLSL
