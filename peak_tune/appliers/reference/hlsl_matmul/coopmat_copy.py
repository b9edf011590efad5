"""Tile copies for the cooperative-matrix step: 16 bytes (8 halves) at a time.

The cooperative-matrix shader's groupshared tiles are an array of uint4 (`pt_smem4`),
each holding 8 consecutive elements of a tile row: the matrix loads read them with
strides in uint4, and every copy moves whole uint4. A piece of 8 elements that lies
inside the matrix, in rows of whole uint4 (`ld % 8 == 0`), is one 16-byte load from the
buffer's uint4 view (A8, B8); any other piece (the matrix edge, odd row lengths) is
gathered element by element, zeros outside, and packed. Same signatures as the element
copies (hlsl_matmul/copy.py), so the K loops call either; the vector-loads flag is
accepted and not needed (every piece is 16 bytes here).

This is what the hand-written shader tests/fixtures/hlsl/coopmat_fp16_staged.slang
does (163-196 TFLOP/s fp16 4096 on an H200 and an H100). The copies alone did not
bring the reference shaders there (30-35 TFLOP/s, as with element copies): the
epilogue through groupshared memory held them back (emit.py's _coopmat_epilogue and
direct-store).
"""

from __future__ import annotations

from peak_tune.appliers.reference.cuda_matmul.emit_copy import Operand, operands
from peak_tune.appliers.reference.cuda_matmul.plan import Plan

from .writer import HlslWriter

__all__ = ["emit_coopmat_copy_helpers", "smem_unit"]

_PARAMS = "int ld, int row0, int row_hi, int col0, int col_hi, int tid"


def smem_unit(offset: str) -> str:
    """The uint4 of pt_smem4 that holds element `offset` (a multiple of 8)."""
    return f"({offset}) / 8"


def emit_coopmat_copy_helpers(writer: HlslWriter, plan: Plan) -> None:
    writer.raw("#if PT_LDA % 8 != 0 || PT_LDB % 8 != 0\n"
               '#error "cooperative-matrix tiles need rows of whole 16-byte pieces"\n'
               "#endif")
    if plan.vector_a or plan.vector_b:  # the K loops' flag: rows of whole pieces
        writer.line("#define PT_VEC 8 /* elements per 16-byte piece */")
    writer.lines(
        "#define PT_ZERO ((DTYPE)0.0f)",
        "[[vk::binding(0)]] StructuredBuffer<uint4> A8; // A and B, 8 halves a piece",
        "[[vk::binding(1)]] StructuredBuffer<uint4> B8;",
        "groupshared uint4 pt_smem4[PT_SMEM_ELEMS / 8]; // every tile, 8 elements a uint4",
        "",
        "uint pt_pair(DTYPE lo, DTYPE hi) { return f32tof16((float)lo) | "
        "(f32tof16((float)hi) << 16); }",
        "")
    for op in operands(plan):
        _piece(writer, op)
        if plan.staging:
            _fetch(writer, op)
            _put(writer, op)
        else:
            _copy(writer, op)


def _flags(op: Operand) -> str:
    return (", bool vec" if op.vector else "") + (", bool edge" if op.unchecked else "")


def _piece(writer: HlslWriter, op: Operand) -> None:
    """pt_piece_<op>: the 8 elements from off, zeros outside, as one uint4."""
    buffer = op.name.upper()
    writer.line(f"// 8 elements of {buffer} from off: one 16-byte load when `full`.")
    with writer.block(f"uint4 pt_piece_{op.name}(int off, bool full, bool row_in, int col, "
                      "int col_hi)"):
        writer.line(f"if (full) return {buffer}8[off / 8];")
        writer.line("DTYPE v[8];")
        with writer.unrolled("q", "8"):
            writer.lines("v[q] = PT_ZERO;",
                         f"if (row_in && col + q < col_hi) v[q] = {buffer}[off + q];")
        writer.line("return uint4(pt_pair(v[0], v[1]), pt_pair(v[2], v[3]), "
                    "pt_pair(v[4], v[5]), pt_pair(v[6], v[7]));")
    writer.line("")


def _pieces(writer: HlslWriter, op: Operand, body: list[str]) -> None:
    """`body` for this thread's 8-element pieces of the tile: r, c and `it` in scope."""
    units = f"{op.rows} * ({op.cols} / 8)"
    with writer.unrolled("it", f"PT_CEIL_DIV({units}, PT_THREADS)"):
        writer.line("const int u = tid + it * PT_THREADS;")
        with writer.block(f"if (({units}) % PT_THREADS == 0 || u < {units})"):
            writer.line(f"const int r = u / ({op.cols} / 8), c = u % ({op.cols} / 8) * 8;")
            writer.lines(*body)


def _read(op: Operand) -> list[str]:
    """A piece's load: with vector-loads' `vec` (rows of whole pieces) and interior-tiles'
    `edge`, literals in the K loop that has both, `full` is a constant there and the
    gather is gone from that loop."""
    unless = "!edge || " if op.unchecked else ""
    whole = "vec" if op.vector else "ld % 8 == 0"
    return [f"const bool row_in = {unless}row0 + r < row_hi;",
            f"const bool full = {whole} && ({unless}(row_in && col0 + c + 8 <= col_hi));",
            f"const uint4 w = pt_piece_{op.name}((row0 + r) * ld + col0 + c, full, row_in, "
            "col0 + c, col_hi);"]


def _slot(op: Operand) -> str:
    return f"pt_smem4[{smem_unit(f's + r * {op.lds} + c')}]"


def _regs(op: Operand) -> str:
    return f"PT_{op.name.upper()}_REGS"


def _copy(writer: HlslWriter, op: Operand) -> None:
    writer.line(f"// The {op.name.upper()} tile ({op.rows} x {op.cols}) into groupshared "
                "memory at s, 16 bytes a piece; zeros outside the matrix.")
    with writer.block(f"void pt_copy_{op.name}(int s, {_PARAMS}{_flags(op)})"):
        _pieces(writer, op, [*_read(op), f"{_slot(op)} = w;"])
    writer.line("")


def _fetch(writer: HlslWriter, op: Operand) -> None:
    writer.line(f"#define {_regs(op)} PT_CEIL_DIV({op.rows} * ({op.cols} / 8), PT_THREADS) "
                f"/* staged 16-byte pieces of {op.name.upper()} per thread */")
    writer.line(f"// Register-staging: this thread's pieces of the {op.name.upper()} tile; "
                "zeros outside.")
    with writer.block(f"void pt_fetch_{op.name}(out uint4 reg[{_regs(op)}], "
                      f"{_PARAMS}{_flags(op)})"):
        _pieces(writer, op, [*_read(op), "reg[it] = w;"])
    writer.line("")


def _put(writer: HlslWriter, op: Operand) -> None:
    vec = ", bool vec" if op.vector else ""
    writer.line(f"// Register-staging: the staged pieces into the {op.name.upper()} tile at s.")
    with writer.block(f"void pt_put_{op.name}(int s, uint4 reg[{_regs(op)}], int tid{vec})"):
        _pieces(writer, op, [f"{_slot(op)} = reg[it];"])
    writer.line("")
