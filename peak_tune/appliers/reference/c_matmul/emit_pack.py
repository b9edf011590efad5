"""Packing of A and B blocks into contiguous buffers (pack-a, pack-b).

A block is packed right inside the later of the two block loops that select it (i and
k for A, k and j for B), so every loop inside reuses it. With a register tile the layout
is the micro-kernel's: A in MR-row panels stored k-major (a panel's column of MR values
is contiguous), B in NR-column panels stored k-major (a row of NR values is contiguous),
both padded with zeros to whole panels. Without one, the copy keeps the row-major block
(row stride KC for A, NC for B). A buffer packed inside the parallel loop is private to
each thread (one slice per thread); one packed outside it is shared and filled by all
threads together.
"""

from __future__ import annotations

from .ir import Nest
from .writer import CodeWriter, Scope, omp_for

__all__ = ["buffer_lines", "emit_pack", "pack_position", "pack_private", "slice_macros"]


def pack_position(nest: Nest, operand: str) -> int | None:
    """Index of the block loop whose body packs `operand` ("a" or "b"), if it is packed."""
    if not getattr(nest, f"pack_{operand}"):
        return None
    dims = ("i", "k") if operand == "a" else ("k", "j")
    positions = [nest.find(d, "block") for d in dims]
    if any(p is None for p in positions):
        return None
    return max(p for p in positions if p is not None)


def pack_private(nest: Nest, operand: str) -> bool:
    """True when the pack runs inside the parallel loop (one buffer slice per thread)."""
    position = pack_position(nest, operand)
    parallel = nest.parallel_index()
    return position is not None and parallel is not None and parallel <= position


def slice_macros(nest: Nest) -> list[str]:
    """#defines for the per-buffer element counts (rounded to 64 elements)."""
    lines = []
    if nest.pack_a:
        rows = "((MC + MR - 1) / MR * MR)" if nest.register_tile else "MC"
        lines.append(f"#define PT_A_SLICE PT_ROUND64((size_t){rows} * KC)")
    if nest.pack_b:
        cols = "((NC + NR - 1) / NR * NR)" if nest.register_tile else "NC"
        lines.append(f"#define PT_B_SLICE PT_ROUND64((size_t)KC * {cols})")
    return lines


def buffer_lines(nest: Nest) -> list[str]:
    """Allocation of the pack buffers at the top of the function."""
    lines = []
    for operand in ("a", "b"):
        if getattr(nest, f"pack_{operand}"):
            big = operand.upper()
            count = f"PT_{big}_SLICE"
            if pack_private(nest, operand):
                count += " * (size_t)pt_threads()"
            lines.append(f"DTYPE *{big}buf = pt_alloc({count});")
    return lines


def emit_pack(writer: CodeWriter, scope: Scope, operand: str) -> None:
    """Declare the packed pointer (Ap or Bp) and fill it for the current block."""
    nest = scope.nest
    big = operand.upper()
    base = f"{big}buf"
    if pack_private(nest, operand):
        base += f" + (size_t)pt_thread() * PT_{big}_SLICE"
    if nest.restrict:
        writer.line(f"DTYPE *restrict {big}p = __builtin_assume_aligned({base}, 64);")
    else:
        writer.line(f"DTYPE *{big}p = {base};")
    if operand == "a" and nest.register_tile:
        _pack_a_panels(writer, scope)
    elif operand == "a":
        _pack_a_rows(writer, scope)
    elif nest.register_tile:
        _pack_b_panels(writer, scope)
    else:
        _pack_b_rows(writer, scope)


def _pack_a_panels(writer: CodeWriter, scope: Scope) -> None:
    r = scope.restrict
    omp_for(writer, scope)
    with writer.block("for (int ip = ib; ip < ie; ip += MR)"):
        writer.line("const int rows = pt_min(MR, ie - ip);")
        writer.line(f"DTYPE *{r}dst = Ap + (size_t)(ip - ib) * (ke - kb);")
        with writer.block("for (int p = 0; p < ke - kb; p++)"):
            writer.line("int r = 0;")
            writer.line("for (; r < rows; r++) dst[p * MR + r] = A[(size_t)(ip + r) * K + kb + p];")
            writer.line("for (; r < MR; r++) dst[p * MR + r] = 0;")


def _pack_b_panels(writer: CodeWriter, scope: Scope) -> None:
    r = scope.restrict
    omp_for(writer, scope)
    with writer.block("for (int jp = jb; jp < je; jp += NR)"):
        writer.line("const int cols = pt_min(NR, je - jp);")
        writer.line(f"DTYPE *{r}dst = Bp + (size_t)(jp - jb) * (ke - kb);")
        with writer.block("for (int p = 0; p < ke - kb; p++)"):
            writer.line(f"const DTYPE *{r}src = B + (size_t)(kb + p) * N + jp;")
            writer.line("int c = 0;")
            writer.line("for (; c < cols; c++) dst[p * NR + c] = src[c];")
            writer.line("for (; c < NR; c++) dst[p * NR + c] = 0;")


def _pack_a_rows(writer: CodeWriter, scope: Scope) -> None:
    omp_for(writer, scope)
    with writer.block("for (int ip = ib; ip < ie; ip++)"):
        writer.line(
            "memcpy(Ap + (size_t)(ip - ib) * KC, A + (size_t)ip * K + kb, "
            "sizeof(DTYPE) * (size_t)(ke - kb));"
        )


def _pack_b_rows(writer: CodeWriter, scope: Scope) -> None:
    omp_for(writer, scope)
    with writer.block("for (int p = 0; p < ke - kb; p++)"):
        writer.line(
            "memcpy(Bp + (size_t)p * NC, B + (size_t)(kb + p) * N + jb, "
            "sizeof(DTYPE) * (size_t)(je - jb));"
        )
