"""Lift the naive CUDA or HIP seed (seeds/matmul/naive.cu, naive.hip) to the NAIVE plan.

The seed is read, not recognised by its text: it must define the entry point with the
matmul signature, derive the output row from the y and the column from the x block and
thread indices, return outside C, accumulate the dot product `acc += A[row*K+k] *
B[k*N+col]` over k from 0 to K in ACC, and store `C[row*N+col] = acc`. Anything else is
not a seed this applier can lift.
"""

from __future__ import annotations

import re

from peak_tune.errors import ApplyError

from .plan import NAIVE, Plan

__all__ = ["lift_seed"]

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CAST = r"(?:\(\s*ACC\s*\)\s*)?"
_SIGNATURE = (r'extern\s+"C"\s+__global__\s+void\s+(?P<entry>\w+)\s*\(\s*const\s+DTYPE\s*\*\s*A\s*,'
              r"\s*const\s+DTYPE\s*\*\s*B\s*,\s*DTYPE\s*\*\s*C\s*,\s*int\s+M\s*,\s*int\s+N\s*,"
              r"\s*int\s+K\s*\)")
_INDEX = r"int\s+(\w+)\s*=\s*blockIdx\.{0}\s*\*\s*blockDim\.{0}\s*\+\s*threadIdx\.{0}\s*;"
_GUARD = r"if\s*\(\s*(\w+)\s*>=\s*M\s*\|\|\s*(\w+)\s*>=\s*N\s*\)\s*return\s*;"
_INIT = r"ACC\s+(\w+)\s*=\s*0\s*;"
_LOOP = (r"for\s*\(\s*int\s+(\w+)\s*=\s*0\s*;\s*(\w+)\s*<\s*K\s*;\s*(?:\+\+\s*(\w+)|(\w+)\s*\+\+)"
         r"\s*\)")
_ACCUMULATE = (rf"(\w+)\s*\+=\s*{_CAST}A\s*\[\s*(\w+)\s*\*\s*K\s*\+\s*(\w+)\s*\]\s*\*\s*{_CAST}"
               r"B\s*\[\s*(\w+)\s*\*\s*N\s*\+\s*(\w+)\s*\]\s*;")
_STORE = r"C\s*\[\s*(\w+)\s*\*\s*N\s*\+\s*(\w+)\s*\]\s*=\s*(?:\(\s*DTYPE\s*\)\s*)?(\w+)\s*;"


def _find(pattern: str, text: str, what: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if not found:
        raise ApplyError(f"seed is not the naive CUDA matmul: no {what}")
    return found


def lift_seed(source: str, entry: str) -> Plan:
    """The plan of the naive one-thread-per-output seed; ApplyError naming what differs."""
    text = _COMMENTS.sub(" ", source)
    signature = re.search(_SIGNATURE, text)
    if not signature or signature.group("entry") != entry:
        raise ApplyError(
            f'seed does not define `extern "C" __global__ void {entry}(const DTYPE *A, '
            "const DTYPE *B, DTYPE *C, int M, int N, int K)`")
    row = _find(_INDEX.format("y"), text, "row index from blockIdx.y / threadIdx.y").group(1)
    col = _find(_INDEX.format("x"), text, "column index from blockIdx.x / threadIdx.x").group(1)
    guard = _find(_GUARD, text, "`if (row >= M || col >= N) return;` guard")
    if guard.groups() != (row, col):
        raise ApplyError("seed guards other variables than its row and column")
    acc = _find(_INIT, text, "`ACC acc = 0;` accumulator").group(1)
    loop = _find(_LOOP, text, "`for (int k = 0; k < K; k++)` loop")
    k = loop.group(1)
    if {v for v in loop.groups()[1:] if v} != {k}:
        raise ApplyError("seed's K loop does not step one variable")
    accumulate = _find(_ACCUMULATE, text, "`acc += A[row * K + k] * B[k * N + col]` statement")
    if accumulate.groups() != (acc, row, k, k, col):
        raise ApplyError("seed accumulates something other than A[row][k] * B[k][col]")
    store = _find(_STORE, text, "`C[row * N + col] = acc` store")
    if store.groups() != (row, col, acc):
        raise ApplyError("seed does not store its accumulator to C[row][col]")
    order = [signature.end(), guard.start(), loop.start(), accumulate.start(), store.start()]
    if order != sorted(order) or len(re.findall(r"\bfor\s*\(", text)) != 1:
        raise ApplyError("seed's statements are not guard, K loop, accumulate, store")
    return NAIVE
