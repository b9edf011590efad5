"""Where the operands and results of one 32 x 32 MFMA live in a wave64: written once,
printed as C by the emitter (emit_mfma) and evaluated on integers by its tests.

The layouts are AMD's for v_mfma_f32_32x32x8f16 (fp16 in: 4 elements of A and of B per
lane, K = 8) and v_mfma_f32_32x32x2f32 (fp32 in: 1 each, K = 2), the same on CDNA2
(gfx90a) and CDNA3 (gfx942, which spells them v_mfma_f32_32x32x8_f16 and
v_mfma_f32_32x32x2_f32), as ROCm's amd_matrix_instruction_calculator prints them
(`matrix_calculator.py -a cdna2 -i v_mfma_f32_32x32x8f16 -A -M`, and -B, -D):

- A (32 x K): element i of lane l is A[l % 32][(l / 32) * P + i], P elements per lane;
- B (K x 32): element i of lane l is B[(l / 32) * P + i][l % 32];
- C and D (32 x 32, fp32, 16 registers): element i of lane l is
  D[8 * (i / 4) + 4 * (l / 32) + i % 4][l % 32].

Each function takes the lane and element index as ints (-> ints) or as C expressions
(`CExpr`, -> C source text), so the printed code and the model cannot differ.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["ACC_ELEMENTS", "LANES", "TILE", "CExpr", "a_element", "b_element", "d_element",
           "per_lane"]

LANES = 64  # a wave64
TILE = 32  # the M and N of the instruction
ACC_ELEMENTS = 16  # accumulators per lane: 32 * 32 / 64


class CExpr:
    """An int-valued C expression: +, *, // (C's `/` on non-negative ints) and % with
    ints or other CExprs give C text, parenthesised where C's precedence needs it (a right
    operand of the same precedence always is: integer division does not reassociate)."""

    _PRECEDENCE = {"+": 1, "*": 2, "/": 2, "%": 2}
    _ATOM = 3

    def __init__(self, text: str, precedence: int = _ATOM) -> None:
        self.text = text
        self.precedence = precedence

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def _operand(value: object, least: int) -> str:
        precedence = value.precedence if isinstance(value, CExpr) else CExpr._ATOM
        return str(value) if precedence >= least else f"({value})"

    def _join(self, op: str, other: object, swap: bool = False) -> CExpr:
        level = self._PRECEDENCE[op]
        left, right = (other, self) if swap else (self, other)
        return CExpr(f"{self._operand(left, level)} {op} {self._operand(right, level + 1)}",
                     level)

    def __add__(self, other: object) -> CExpr:
        return self._join("+", other)

    def __radd__(self, other: object) -> CExpr:
        return self._join("+", other, swap=True)

    def __mul__(self, other: object) -> CExpr:
        return self._join("*", other)

    def __rmul__(self, other: object) -> CExpr:
        return self._join("*", other, swap=True)

    def __floordiv__(self, other: object) -> CExpr:
        return self._join("/", other)

    def __mod__(self, other: object) -> CExpr:
        return self._join("%", other)


Index = TypeVar("Index", int, CExpr)


def per_lane(element_bytes: int) -> int:
    """A and B elements per lane: 4 for fp16 (32x32x8), 1 for fp32 (32x32x2)."""
    return {2: 4, 4: 1}[element_bytes]


def a_element(lane: Index, i: Index, per: Index | int) -> tuple[Index, Index]:
    """(row m, column k) of A in element i of the lane's A operand."""
    return lane % TILE, lane // TILE * per + i


def b_element(lane: Index, i: Index, per: Index | int) -> tuple[Index, Index]:
    """(row k, column n) of B in element i of the lane's B operand."""
    return lane // TILE * per + i, lane % TILE


def d_element(lane: Index, i: Index) -> tuple[Index, Index]:
    """(row m, column n) of the 32 x 32 result in accumulator element i of the lane."""
    return i // 4 * 8 + lane // TILE * 4 + i % 4, lane % TILE
