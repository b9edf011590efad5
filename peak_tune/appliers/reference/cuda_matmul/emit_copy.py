"""Tile copies from global to shared memory: plain, staged in registers, or with cp.async.

One device function per operand and mode, written for the plan: a tile of R x C
elements at (row0, col0) of a row-major matrix with `ld` columns, valid where
row < row_hi and col < col_hi; everything outside is written as zero, so the compute
needs no bounds checks. All PT_THREADS threads share the work, element by element
(consecutive threads take consecutive columns: coalesced) or, with vector-loads,
16 bytes (PT_VEC elements) at a time when `vec` says the rows are 16-byte aligned;
pieces that straddle the matrix edge fall back to elements.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan
from .writer import CodeWriter

__all__ = ["Operand", "copy_call", "element_loop", "emit_copy_helpers", "operands", "put_call",
           "vector_loop"]

_PARAMS = ("const DTYPE *__restrict__ g, int ld, int row0, int row_hi, int col0, int col_hi, "
           "int tid")
_GUARDED = "row_in && col0 + c + q < col_hi ? g[off + q] : PT_ZERO"


@dataclass(frozen=True)
class Operand:
    name: str  # "a" | "b"
    rows: str  # tile rows in the global matrix's orientation
    cols: str
    at: str  # accessor macro (s, r, c) -> shared element
    lds: str  # shared row stride macro
    contiguous: bool  # tile rows are contiguous rows in shared memory too
    vector: bool  # 16-byte copies (vector-loads)
    unchecked: bool  # a `bool edge` argument: false skips the bounds checks (interior-tiles)

    def store(self, r: str, c: str) -> str:
        return f"{self.at}(s, {r}, {c})"


def operands(plan: Plan) -> tuple[Operand, Operand]:
    a = Operand("a", "BLOCK_M", "PT_TK", "PT_AS", "PT_LDA", not plan.transpose_a, plan.vector_a,
                plan.interior)
    b = Operand("b", "PT_TK", "BLOCK_N", "PT_BS", "PT_LDB", True, plan.vector_b, plan.interior)
    return a, b


def copy_call(op: Operand, function: str, target: str, k0: str, vec: str, edge: str) -> str:
    """The call of pt_<function>_<op> for the tile at k0 (kernel variables in scope);
    `vec` is the 16-byte flag's value ("true" / "false") for a vectorised operand, `edge`
    whether the bounds are checked, for an operand with interior-tiles' flag."""
    if op.name == "a":
        where = f"A, K, bm, M, {k0}, k_hi"
    else:
        where = f"B, N, {k0}, k_hi, bn, N"
    flags = (f", {vec}" if op.vector else "") + (f", {edge}" if op.unchecked else "")
    return f"pt_{function}_{op.name}({target}, {where}, tid{flags});"


def put_call(op: Operand, target: str, registers: str, vec: str) -> str:
    """The call of register-staging's pt_put_<op>: the staged `registers` into the shared
    tile at `target` (16-byte stores where `vec`, for a vectorised operand)."""
    flag = f", {vec}" if op.vector else ""
    return f"pt_put_{op.name}({target}, {registers}, tid{flag});"


def emit_copy_helpers(writer: CodeWriter, plan: Plan) -> None:
    layout_a = "s[(k) * PT_LDA + (m)]" if plan.transpose_a else "s[(m) * PT_LDA + (k)]"
    writer.lines(f"#define PT_AS(s, m, k) {layout_a}",
                 "#define PT_BS(s, k, n) s[(k) * PT_LDB + (n)]", "#define PT_ZERO DTYPE(0.0f)")
    if plan.vector_a or plan.vector_b:
        writer.lines("#define PT_VEC (16 / (int)sizeof(DTYPE)) /* elements per 16 bytes */",
                     'static_assert(PT_TK % PT_VEC == 0 && BLOCK_N % PT_VEC == 0, '
                     '"16-byte copies need whole vectors per tile row");')
        if plan.staging:
            writer.line("#define PT_MAX(a, b) ((a) > (b) ? (a) : (b))")
    writer.line("")
    for op in operands(plan):
        if plan.staging:
            _fetch(writer, op)
            _put(writer, op)
        elif plan.stages:
            _copy(writer, op, asynchronous=True)
        else:
            _copy(writer, op, asynchronous=False)


# ------------------------------------------------------------------ loops


def element_loop(writer: CodeWriter, op: Operand, body: list[str]) -> None:
    """`body` for this thread's elements e of the tile: (r, c) in scope."""
    count = f"{op.rows} * {op.cols}"
    with writer.unrolled("it", f"PT_CEIL_DIV({count}, PT_THREADS)"):
        writer.line("const int e = tid + it * PT_THREADS;")
        with writer.block(f"if (({count}) % PT_THREADS == 0 || e < {count})"):
            writer.line(f"const int r = e / {op.cols}, c = e % {op.cols};")
            writer.lines(*body)


def vector_loop(writer: CodeWriter, op: Operand, body: list[str]) -> None:
    """`body` for this thread's PT_VEC-element pieces of the tile: (r, c) in scope."""
    units = f"{op.rows} * ({op.cols} / PT_VEC)"
    with writer.unrolled("it", f"PT_CEIL_DIV({units}, PT_THREADS)"):
        writer.line("const int u = tid + it * PT_THREADS;")
        with writer.block(f"if (({units}) % PT_THREADS == 0 || u < {units})"):
            writer.line(f"const int r = u / ({op.cols} / PT_VEC), "
                        f"c = u % ({op.cols} / PT_VEC) * PT_VEC;")
            writer.lines(*body)


def _bounds(op: Operand) -> list[str]:
    """`in`: the element (r, c) lies inside the matrix (always, off the edge)."""
    inside = "row0 + r < row_hi && col0 + c < col_hi"
    return [f"const bool in = {f'!edge || ({inside})' if op.unchecked else inside};",
            "const size_t off = (size_t)(row0 + r) * ld + col0 + c;"]


def _vector_bounds(op: Operand) -> list[str]:
    """`row_in`: row r lies inside; `full`: so do the PT_VEC elements from (r, c)."""
    unless = "!edge || " if op.unchecked else ""
    return [f"const bool row_in = {unless}row0 + r < row_hi;",
            f"const bool full = {unless}(row_in && col0 + c + PT_VEC <= col_hi);",
            "const size_t off = (size_t)(row0 + r) * ld + col0 + c;"]


def _scatter(op: Operand, source: str) -> list[str]:
    """Write PT_VEC elements `source(q)` at (r, c + q)."""
    return ["#pragma unroll", f"for (int q = 0; q < PT_VEC; ++q) "
            f"{op.store('r', 'c + q')} = {source};"]


def _store_vector(op: Operand, value: str, may_align: bool = True) -> list[str]:
    """Store the uint4 `value` at (r, c..c+PT_VEC): one 16-byte store where aligned."""
    scatter = ["DTYPE t[PT_VEC];", f"memcpy(t, &{value}, 16);", *_scatter(op, "t[q]")]
    if not (op.contiguous and may_align):
        return scatter
    return [f"if constexpr ({op.lds} * sizeof(DTYPE) % 16 == 0) "
            f"*reinterpret_cast<uint4 *>(&{op.store('r', 'c')}) = {value};",
            "else {", *["    " + line for line in scatter], "}"]


def _load_vector(op: Operand, may_align: bool = True) -> list[str]:
    """Sync 16-byte copy of one piece (elements at the edge of the matrix)."""
    return ["if (full) {",
            "    const uint4 v = *reinterpret_cast<const uint4 *>(g + off);",
            *["    " + line for line in _store_vector(op, "v", may_align)],
            "} else {", *["    " + line for line in _scatter(op, _GUARDED)], "}"]


# ------------------------------------------------------------------ modes


def _flag_parameters(op: Operand) -> str:
    return (", bool vec" if op.vector else "") + (", bool edge" if op.unchecked else "")


def _signature(op: Operand, function: str) -> str:
    return (f"__device__ __forceinline__ void pt_{function}_{op.name}(DTYPE *__restrict__ s, "
            f"{_PARAMS}{_flag_parameters(op)})")


def _copy(writer: CodeWriter, op: Operand, asynchronous: bool) -> None:
    what = "cp.async (sync where cp.async cannot)" if asynchronous else "plain loads and stores"
    writer.line(f"// The {op.name.upper()} tile ({op.rows} x {op.cols}) into shared memory "
                f"with {what}; zeros outside.")
    function = "copy_async" if asynchronous else "copy"
    with writer.block(_signature(op, function)):
        if op.vector:
            with writer.block("if (vec)"):
                copy = _async_vector(op) if asynchronous else _load_vector(op)
                body = _vector_bounds(op) + copy
                vector_loop(writer, op, body)
                writer.line("return;")
        if asynchronous:
            element = ["if constexpr (sizeof(DTYPE) >= 4) pt_cp_async<sizeof(DTYPE)>("
                       f"&{op.store('r', 'c')}, in ? g + off : g, in);",
                       f"else {op.store('r', 'c')} = in ? g[off] : PT_ZERO;"]
        else:
            element = [f"{op.store('r', 'c')} = in ? g[off] : PT_ZERO;"]
        element_loop(writer, op, _bounds(op) + element)
    writer.line("")


def _async_vector(op: Operand) -> list[str]:
    if not op.contiguous:
        return _load_vector(op)
    edge = ["    " + line for line in _scatter(op, _GUARDED)]
    inside = ["if (full || !row_in || col0 + c >= col_hi)",
              f"    pt_cp_async<16>(&{op.store('r', 'c')}, full ? g + off : g, full);",
              "else {", *edge, "}"]
    return [f"if constexpr ({op.lds} * sizeof(DTYPE) % 16 == 0) {{",
            *["    " + line for line in inside], "} else {",
            *["    " + line for line in _load_vector(op, may_align=False)], "}"]


def _regs(op: Operand) -> str:
    return f"PT_{op.name.upper()}_REGS"


def _fetch(writer: CodeWriter, op: Operand) -> None:
    count = f"{op.rows} * {op.cols}"
    per_thread = f"PT_CEIL_DIV({count}, PT_THREADS)"
    if op.vector:
        vector = f"PT_CEIL_DIV({op.rows} * ({op.cols} / PT_VEC), PT_THREADS) * PT_VEC"
        per_thread = f"PT_MAX({per_thread}, {vector})"
    writer.line(f"#define {_regs(op)} {per_thread} /* staged {op.name.upper()} elements "
                "per thread */")
    writer.line(f"// Register-staging: this thread's share of the {op.name.upper()} tile "
                "from global memory into registers; zeros outside.")
    head = (f"__device__ __forceinline__ void pt_fetch_{op.name}(DTYPE (&reg)[{_regs(op)}], "
            f"{_PARAMS}{_flag_parameters(op)})")
    with writer.block(head):
        if op.vector:
            with writer.block("if (vec)"):
                fetch = ["if (full) {",
                         "    const uint4 v = *reinterpret_cast<const uint4 *>(g + off);",
                         "    DTYPE t[PT_VEC];", "    memcpy(t, &v, 16);",
                         "    #pragma unroll",
                         "    for (int q = 0; q < PT_VEC; ++q) reg[it * PT_VEC + q] = t[q];",
                         "} else {", "    #pragma unroll",
                         f"    for (int q = 0; q < PT_VEC; ++q) reg[it * PT_VEC + q] = {_GUARDED};",
                         "}"]
                vector_loop(writer, op, _vector_bounds(op) + fetch)
                writer.line("return;")
        element_loop(writer, op, _bounds(op) + ["reg[it] = in ? g[off] : PT_ZERO;"])
    writer.line("")


def _put(writer: CodeWriter, op: Operand) -> None:
    writer.line(f"// Register-staging: the staged {op.name.upper()} elements into the "
                "shared tile.")
    vec = ", bool vec" if op.vector else ""
    head = (f"__device__ __forceinline__ void pt_put_{op.name}(DTYPE *__restrict__ s, "
            f"const DTYPE (&reg)[{_regs(op)}], int tid{vec})")
    with writer.block(head):
        if op.vector:
            with writer.block("if (vec)"):
                gather = ["DTYPE w[PT_VEC];", "#pragma unroll",
                          "for (int q = 0; q < PT_VEC; ++q) w[q] = reg[it * PT_VEC + q];",
                          "uint4 v;", "memcpy(&v, w, 16);", *_store_vector(op, "v")]
                vector_loop(writer, op, gather)
                writer.line("return;")
        element_loop(writer, op, [f"{op.store('r', 'c')} = reg[it];"])
    writer.line("")
