"""The innermost section with a register tile: the micro loops (steps MR and NR) in the
nest's order, and in their body an MR x NR block of C accumulated over the k point loop.

A full tile keeps its MR x NR accumulators in registers (vectors of NR / PT_VL lanes
when vectorised, scalars otherwise) and writes them once at the end: stored on the
first visit over K, added afterwards. When both operands are packed, panels are zero
padded, so an edge tile is computed in full and only its valid part is written. When
an operand is read in place, edge tiles (fewer than MR rows or NR columns) take a
scalar path that never reads past the matrices.
"""

from __future__ import annotations

from .ir import Loop
from .writer import CodeWriter, Scope, group

__all__ = ["emit_tile_section"]

_STEP = {"i": ("ir", "MR"), "j": ("jr", "NR")}


def emit_tile_section(writer: CodeWriter, scope: Scope, index: int) -> None:
    micro = tuple(loop for loop in scope.nest.loops[index:] if loop.level == "micro")
    _micro(writer, scope, micro, {})


def _micro(writer: CodeWriter, scope: Scope, loops: tuple[Loop, ...], ends: dict[str, str]
           ) -> None:
    if not loops:
        _tile(writer, scope, ends)
        return
    loop = loops[0]
    var, step = _STEP[loop.dim]
    if loop.parallel:
        writer.pragma("omp parallel for schedule(static, OMP_CHUNK)")
    lo, hi = scope.lo(loop.dim), scope.hi(loop.dim)
    with writer.block(f"for (int {var} = {lo}; {var} < {hi}; {var} += {step})"):
        inner = scope.narrowed(loop.dim, var, hi).deeper()
        _micro(writer, inner, loops[1:], {**ends, loop.dim: hi})


def _span(scope: Scope) -> str:
    lo, hi = scope.lo("k"), scope.hi("k")
    return hi if lo == "0" else f"{hi} - {lo}"


def _a(scope: Scope, r: str, p: str) -> str:
    if scope.nest.pack_a:
        return f"a_[{group(p)} * MR + {group(r)}]"
    return f"a_[(size_t){group(r)} * K + {group(p)}]"


def _b(scope: Scope, p: str, c: str) -> str:
    if scope.nest.pack_b:
        return f"b_[{group(p)} * NR + {group(c)}]"
    return f"b_[(size_t){group(p)} * N + {group(c)}]"


def _tile(writer: CodeWriter, scope: Scope, ends: dict[str, str]) -> None:
    nest, r = scope.nest, scope.restrict
    writer.line(f"const int mr = pt_min(MR, {ends['i']} - ir), nr = pt_min(NR, {ends['j']} - jr);")
    writer.line(f"const int kc = {_span(scope)};")
    k0 = scope.lo("k")
    if nest.pack_a:
        writer.line(f"const DTYPE *{r}a_ = Ap + (size_t)(ir - ib) * kc;")
    else:
        offset = "" if k0 == "0" else f" + {k0}"
        writer.line(f"const DTYPE *{r}a_ = A + (size_t)ir * K{offset};")
    if nest.pack_b:
        writer.line(f"const DTYPE *{r}b_ = Bp + (size_t)(jr - jb) * kc;")
    else:
        offset = "" if k0 == "0" else f"(size_t){group(k0)} * N + "
        writer.line(f"const DTYPE *{r}b_ = B + {offset}jr;")
    writer.line(f"DTYPE *{r}c_ = {scope.out} + (size_t)ir * N + jr;")
    if nest.pack_a and nest.pack_b:
        with writer.block(""):
            _accumulate(writer, scope)
            _store(writer, scope, edges=True)
        return
    with writer.block("if (mr == MR && nr == NR)"):
        _accumulate(writer, scope)
        _store(writer, scope, edges=False)
    with writer.block("else"):
        _edge(writer, scope)


def _accumulate(writer: CodeWriter, scope: Scope) -> None:
    """Declare the accumulators and run the k point loop over the tile."""
    vector = bool(scope.nest.vector_bits)
    writer.line("pt_vec acc[MR][PT_NV];" if vector else "DTYPE acc[MR][NR];")
    writer.pragma("GCC unroll 32")
    with writer.block("for (int r = 0; r < MR; r++)"):
        if vector:
            writer.pragma("GCC unroll 16")
            writer.line("for (int v = 0; v < PT_NV; v++) acc[r][v] = (pt_vec){0};")
        else:
            writer.line("for (int c = 0; c < NR; c++) acc[r][c] = 0;")
    if scope.nest.unroll_k:
        writer.line("const int p_main = kc / UNROLL_K * UNROLL_K;")
        with writer.block("for (int p = 0; p < p_main; p += UNROLL_K)"):
            writer.pragma("GCC unroll 16")
            with writer.block("for (int u = 0; u < UNROLL_K; u++)"):
                _step(writer, scope, "p + u")
        with writer.block("for (int p = p_main; p < kc; p++)"):
            _step(writer, scope, "p")
        return
    with writer.block("for (int p = 0; p < kc; p++)"):
        _step(writer, scope, "p")


def _step(writer: CodeWriter, scope: Scope, p: str) -> None:
    """One k value: an outer product of MR values of A and NR values of B."""
    nest = scope.nest
    if nest.prefetch:
        _prefetch(writer, scope, p)
    if not nest.vector_bits:
        writer.pragma("GCC unroll 32")
        with writer.block("for (int r = 0; r < MR; r++)"):
            writer.line(f"const DTYPE a = {_a(scope, 'r', p)};")
            writer.line(f"for (int c = 0; c < NR; c++) acc[r][c] += a * {_b(scope, p, 'c')};")
        return
    writer.line("pt_vec b[PT_NV];")
    writer.pragma("GCC unroll 16")
    source = _b(scope, p, "v * PT_VL")
    if nest.restrict and nest.pack_b:
        writer.line(f"for (int v = 0; v < PT_NV; v++) b[v] = *(const pt_vec *)&{source};")
    else:
        writer.line(f"for (int v = 0; v < PT_NV; v++) memcpy(&b[v], &{source}, sizeof(pt_vec));")
    writer.pragma("GCC unroll 32")
    with writer.block("for (int r = 0; r < MR; r++)"):
        writer.line(f"const DTYPE a = {_a(scope, 'r', p)};")
        writer.pragma("GCC unroll 16")
        writer.line("for (int v = 0; v < PT_NV; v++) acc[r][v] += b[v] * a;")


def _prefetch(writer: CodeWriter, scope: Scope, p: str) -> None:
    """Prefetch the B row (and the packed A column) PREFETCH_DIST k steps ahead."""
    writer.line(f"const int pf = pt_min({p} + PREFETCH_DIST, kc - 1);")
    writer.line(
        f"for (int c = 0; c < NR; c += PT_LINE) __builtin_prefetch(&{_b(scope, 'pf', 'c')});"
    )
    if scope.nest.pack_a:
        writer.line(
            f"for (int r = 0; r < MR; r += PT_LINE) __builtin_prefetch(&{_a(scope, 'r', 'pf')});"
        )


def _store(writer: CodeWriter, scope: Scope, edges: bool) -> None:
    """Write the accumulators to C: whole vectors for a full tile, else the valid part
    (`edges`: the tile may be partial, its padding computed from zero-padded panels)."""
    first = scope.first
    if scope.nest.vector_bits and not edges:
        _store_vectors(writer, first)
        return
    if scope.nest.vector_bits:
        with writer.block("if (mr == MR && nr == NR)"):
            _store_vectors(writer, first)
        writer.line("else {")
        writer.line("    DTYPE t[MR][NR];")
        writer.line("    memcpy(t, acc, sizeof t);")
        _store_scalars(writer, first, "t", indent="    ")
        writer.line("}")
        return
    _store_scalars(writer, first, "acc", indent="")


def _store_vectors(writer: CodeWriter, first: str) -> None:
    target = "c_ + (size_t)r * N + v * PT_VL"
    store = f"memcpy({target}, &acc[r][v], sizeof(pt_vec));"
    add = (
        f"{{ pt_vec old; memcpy(&old, {target}, sizeof old); old += acc[r][v]; "
        f"memcpy({target}, &old, sizeof old); }}"
    )
    if first == "1":
        _vector_loop(writer, store)
        return
    with writer.block(f"if ({first})"):
        _vector_loop(writer, store)
    with writer.block("else"):
        _vector_loop(writer, add)


def _vector_loop(writer: CodeWriter, body: str) -> None:
    writer.pragma("GCC unroll 32")
    with writer.block("for (int r = 0; r < MR; r++)"):
        writer.pragma("GCC unroll 16")
        writer.line(f"for (int v = 0; v < PT_NV; v++) {body}")


def _store_scalars(writer: CodeWriter, first: str, source: str, indent: str) -> None:
    cell = "c_[(size_t)r * N + c]"
    value = f"{source}[r][c]"
    if first != "1":
        value = f"{first} ? {value} : {cell} + {value}"
    writer.line(f"{indent}for (int r = 0; r < mr; r++)")
    writer.line(f"{indent}    for (int c = 0; c < nr; c++) {cell} = {value};")


def _edge(writer: CodeWriter, scope: Scope) -> None:
    """A partial tile read in place: one dot product per element, no read past the edge."""
    first = scope.first
    cell = "c_[(size_t)r * N + c]"
    with writer.block("for (int r = 0; r < mr; r++)"):
        with writer.block("for (int c = 0; c < nr; c++)"):
            writer.line("DTYPE sum = 0;")
            product = f"{_a(scope, 'r', 'p')} * {_b(scope, 'p', 'c')}"
            writer.line(f"for (int p = 0; p < kc; p++) sum += {product};")
            value = "sum" if first == "1" else f"{first} ? sum : {cell} + sum"
            writer.line(f"{cell} = {value};")
