"""Where the operands and results of one MFMA live in a wave64: written once, printed
as C by the emitter (emit_mfma) and evaluated on integers by its tests.

Two tile sizes T, each with an fp16 and an fp32 instruction, the same on CDNA2 (gfx90a)
and CDNA3 (gfx942, which spells them with an underscore before the type:
v_mfma_f32_32x32x8_f16), as ROCm's amd_matrix_instruction_calculator prints them
(`matrix_calculator.py -a cdna2 -i v_mfma_f32_32x32x8f16 -A -M`, and -B, -D):

| T | fp16 in | fp32 in | accumulators per lane |
| --- | --- | --- | --- |
| 32 | v_mfma_f32_32x32x8f16 | v_mfma_f32_32x32x2f32 | 16 |
| 16 | v_mfma_f32_16x16x16f16 | v_mfma_f32_16x16x4f32 | 4 |

The 64 lanes form G = 64 / T groups of T; P elements of A and of B per lane (4 for fp16,
1 for fp32), so one instruction is T x T x (G * P):

- A (T x K): element i of lane l is A[l % T][(l / T) * P + i];
- B (K x T): element i of lane l is B[(l / T) * P + i][l % T];
- C and D (T x T, fp32, T * T / 64 registers): element i of lane l is
  D[4 * G * (i / 4) + 4 * (l / T) + i % 4][l % T] (each group holds 4 rows of every
  block of 4 * G rows: 8 rows for T = 32, all 16 for T = 16).

Each function takes the lane, element index and tile as ints (-> ints) or as C
expressions (`CExpr`, -> C source text), so the printed code and the model cannot differ.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["LANES", "TILES", "CExpr", "a_element", "accumulators", "b_element", "d_element",
           "per_lane"]

LANES = 64  # a wave64
TILES = (16, 32)  # the M and N of the instructions


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
    """A and B elements per lane: 4 for fp16, 1 for fp32 (either tile)."""
    return {2: 4, 4: 1}[element_bytes]


def accumulators(tile: int) -> int:
    """fp32 results per lane of one T x T tile: 16 for T = 32, 4 for T = 16."""
    return tile * tile // LANES


def a_element(lane: Index, i: Index, per: Index | int, tile: Index | int
              ) -> tuple[Index, Index]:
    """(row m, column k) of A in element i of the lane's A operand."""
    return lane % tile, lane // tile * per + i


def b_element(lane: Index, i: Index, per: Index | int, tile: Index | int
              ) -> tuple[Index, Index]:
    """(row k, column n) of B in element i of the lane's B operand."""
    return lane // tile * per + i, lane % tile


def d_element(lane: Index, i: Index, tile: Index | int, rows_per_block: Index | int
              ) -> tuple[Index, Index]:
    """(row m, column n) of the T x T result in accumulator element i of the lane;
    `rows_per_block` is 4 * G = 256 / T (8 or 16), the rows one block of 4 registers spans."""
    return i // 4 * rows_per_block + lane // tile * 4 + i % 4, lane % tile
