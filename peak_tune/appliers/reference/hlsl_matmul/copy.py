"""Tile copies from the storage buffers to groupshared memory, written in HLSL.

One function per operand and mode, as in the CUDA printer (cuda_matmul/emit_copy.py):
a tile of R x C elements at (row0, col0) of a row-major matrix with `ld` columns, valid
where row < row_hi and col < col_hi; everything outside is written as zero, so the
compute needs no bounds checks. All PT_THREADS threads share the work, element by
element (consecutive threads take consecutive columns: coalesced) or, with vector-loads,
PT_VEC = 4 elements at a time (a float4 or half4 from the buffer's vector view) when
`vec` says the rows are whole vectors; pieces that straddle the matrix edge fall back
to elements.

HLSL has no pointers: a tile is an offset into the one groupshared array (PT_AS(s, m, k)
is pt_smem[s + ...]), and each operand's functions read their own buffer (A or B).
HLSL's `?:` evaluates both sides, so a guarded read is an `if` (pt_load_a), never a
conditional expression: a read outside the matrix is never made.
"""

from __future__ import annotations

from peak_tune.appliers.reference.cuda_matmul.emit_copy import (
    Operand,
    element_loop,
    operands,
    vector_loop,
)
from peak_tune.appliers.reference.cuda_matmul.plan import Plan

from .writer import HlslWriter

__all__ = ["copy_call", "emit_copy_helpers", "put_call"]

_PARAMS = "int ld, int row0, int row_hi, int col0, int col_hi, int tid"


def copy_call(op: Operand, function: str, target: str, k0: str, vec: str, edge: str) -> str:
    """The call of pt_<function>_<op> for the tile at k0 (kernel variables in scope)."""
    where = f"K, bm, M, {k0}, k_hi" if op.name == "a" else f"N, {k0}, k_hi, bn, N"
    flags = (f", {vec}" if op.vector else "") + (f", {edge}" if op.unchecked else "")
    return f"pt_{function}_{op.name}({target}, {where}, tid{flags});"


def put_call(op: Operand, target: str, registers: str, vec: str) -> str:
    flag = f", {vec}" if op.vector else ""
    return f"pt_put_{op.name}({target}, {registers}, tid{flag});"


def emit_copy_helpers(writer: HlslWriter, plan: Plan) -> None:
    layout_a = "pt_smem[(s) + (k) * PT_LDA + (m)]" if plan.transpose_a else \
        "pt_smem[(s) + (m) * PT_LDA + (k)]"
    writer.lines(f"#define PT_AS(s, m, k) {layout_a}",
                 "#define PT_BS(s, k, n) pt_smem[(s) + (k) * PT_LDB + (n)]",
                 "#define PT_ZERO ((DTYPE)0.0f) /* glslang converts no int to half */")
    vector = plan.vector_a or plan.vector_b
    if vector:
        writer.raw("#define PT_VEC 4 /* vector-loads: elements per vector */\n"
                   "#if PT_TK % PT_VEC != 0 || BLOCK_N % PT_VEC != 0\n"
                   '#error "vector copies need whole vectors per tile row"\n'
                   "#endif")
        if plan.staging:
            writer.line("#define PT_MAX(a, b) ((a) > (b) ? (a) : (b))")
    writer.lines("", "groupshared DTYPE pt_smem[PT_SMEM_ELEMS]; // every tile, every buffer", "")
    for op in operands(plan):
        _loads(writer, op)
        if plan.staging:
            _fetch(writer, op)
            _put(writer, op)
        else:
            _copy(writer, op)


# ------------------------------------------------------------------ pieces


def _buffer(op: Operand) -> str:
    return op.name.upper()


def _loads(writer: HlslWriter, op: Operand) -> None:
    """pt_load_<op>: one element, zero where `inside` is false; pt_load4_<op>: PT_VEC of them."""
    buffer = _buffer(op)
    with writer.block(f"DTYPE pt_load_{op.name}(int off, bool inside)"):
        writer.lines("DTYPE v = PT_ZERO;", f"if (inside) v = {buffer}[off];", "return v;")
    writer.line("")
    if not op.vector:
        return
    writer.line(f"// PT_VEC elements of {buffer} from off (a multiple of PT_VEC): one vector "
                "load when all lie inside.")
    with writer.block(f"void pt_load4_{op.name}(out DTYPE v[PT_VEC], int off, bool full, "
                      "bool row_in, int col, int col_hi)"):
        with writer.block("if (full)"):
            writer.line(f"const PT_DTYPE4 w = {buffer}4[off / PT_VEC];")
            with writer.unrolled("q", "PT_VEC"):
                writer.line("v[q] = w[q];")
        with writer.block("else"):
            with writer.unrolled("q", "PT_VEC"):
                writer.line(f"v[q] = pt_load_{op.name}(off + q, row_in && col + q < col_hi);")
    writer.line("")


def _bounds(op: Operand) -> list[str]:
    inside = "row0 + r < row_hi && col0 + c < col_hi"
    return [f"const bool inside = {f'!edge || ({inside})' if op.unchecked else inside};",
            "const int off = (row0 + r) * ld + col0 + c;"]


def _vector_read(op: Operand) -> list[str]:
    """`v`: the PT_VEC elements at (r, c), zeros outside the matrix."""
    unless = "!edge || " if op.unchecked else ""
    return [f"const bool row_in = {unless}row0 + r < row_hi;",
            f"const bool full = {unless}(row_in && col0 + c + PT_VEC <= col_hi);",
            "const int off = (row0 + r) * ld + col0 + c;",
            "DTYPE v[PT_VEC];",
            f"pt_load4_{op.name}(v, off, full, row_in, col0 + c, col_hi);"]


def _each_q(statement: str) -> list[str]:
    return ["[unroll]", f"for (int q = 0; q < PT_VEC; ++q) {statement}"]


def _flags(op: Operand) -> str:
    return (", bool vec" if op.vector else "") + (", bool edge" if op.unchecked else "")


def _split(writer: HlslWriter, op: Operand, vector_body: list[str],
           element_body: list[str]) -> None:
    """The vector loop where `vec`, else the element loop."""
    if op.vector:
        with writer.block("if (vec)"):
            vector_loop(writer, op, vector_body)
        with writer.block("else"):
            element_loop(writer, op, element_body)
    else:
        element_loop(writer, op, element_body)


def _copy(writer: HlslWriter, op: Operand) -> None:
    writer.line(f"// The {_buffer(op)} tile ({op.rows} x {op.cols}) into groupshared memory "
                "at s; zeros outside the matrix.")
    with writer.block(f"void pt_copy_{op.name}(int s, {_PARAMS}{_flags(op)})"):
        _split(writer, op, _vector_read(op) + _each_q(f"{op.store('r', 'c + q')} = v[q];"),
               _bounds(op) + [f"{op.store('r', 'c')} = pt_load_{op.name}(off, inside);"])
    writer.line("")


def _regs(op: Operand) -> str:
    return f"PT_{_buffer(op)}_REGS"


def _fetch(writer: HlslWriter, op: Operand) -> None:
    per_thread = f"PT_CEIL_DIV({op.rows} * {op.cols}, PT_THREADS)"
    if op.vector:
        vector = f"PT_CEIL_DIV({op.rows} * ({op.cols} / PT_VEC), PT_THREADS) * PT_VEC"
        per_thread = f"PT_MAX({per_thread}, {vector})"
    writer.line(f"#define {_regs(op)} {per_thread} /* staged {_buffer(op)} elements "
                "per thread */")
    writer.line(f"// Register-staging: this thread's share of the {_buffer(op)} tile into "
                "registers; zeros outside.")
    head = f"void pt_fetch_{op.name}(out DTYPE reg[{_regs(op)}], {_PARAMS}{_flags(op)})"
    with writer.block(head):
        _split(writer, op, _vector_read(op) + _each_q("reg[it * PT_VEC + q] = v[q];"),
               _bounds(op) + [f"reg[it] = pt_load_{op.name}(off, inside);"])
    writer.line("")


def _put(writer: HlslWriter, op: Operand) -> None:
    writer.line(f"// Register-staging: the staged {_buffer(op)} elements into the tile at s.")
    vec = ", bool vec" if op.vector else ""
    with writer.block(f"void pt_put_{op.name}(int s, DTYPE reg[{_regs(op)}], int tid{vec})"):
        _split(writer, op, _each_q(f"{op.store('r', 'c + q')} = reg[it * PT_VEC + q];"),
               [f"{op.store('r', 'c')} = reg[it];"])
    writer.line("")
