"""The innermost section without a register tile: the i, j and k point loops in the
nest's order, one multiply-add per innermost iteration.

With k innermost the section is the seed's dot product (a scalar accumulator, stored
once per element and visit). With k further out each element of C is updated in place,
so the block of C the section covers is zeroed on its first visit over K. Unrolling k
by UNROLL_K sums UNROLL_K products per element before touching the accumulator or C
(unroll-and-jam when loops lie inside k), with a remainder loop for the last K % UNROLL_K
values. Vectorisation marks the innermost loop `omp simd` (a reduction when it is k).
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Loop
from .writer import CodeWriter, Scope, group, omp_for

__all__ = ["emit_point_section"]


def emit_point_section(writer: CodeWriter, scope: Scope, index: int) -> None:
    loops = scope.nest.loops[index:]
    if loops[-1].dim != "k":
        _zero_block(writer, scope)
    _points(writer, scope, loops, jam=False)


def _a(scope: Scope, i: str, k: str) -> str:
    if scope.nest.pack_a:
        return f"Ap[(size_t){group(i + ' - ib')} * KC + {group(k + ' - kb')}]"
    return f"A[(size_t){group(i)} * K + {group(k)}]"


def _b(scope: Scope, k: str, j: str) -> str:
    if scope.nest.pack_b:
        return f"Bp[(size_t){group(k + ' - kb')} * NC + {group(j + ' - jb')}]"
    return f"B[(size_t){group(k)} * N + {group(j)}]"


def _c(scope: Scope, i: str, j: str) -> str:
    return f"{scope.out}[(size_t){group(i)} * N + {group(j)}]"


def _zero_block(writer: CodeWriter, scope: Scope) -> None:
    if scope.first != "1":
        with writer.block(f"if ({scope.first})"):
            _zero_block(writer, replace(scope, first="1"))
        return
    omp_for(writer, scope)
    with writer.block(f"for (int i = {scope.lo('i')}; i < {scope.hi('i')}; i++)"):
        writer.line(
            f"for (int j = {scope.lo('j')}; j < {scope.hi('j')}; j++) {_c(scope, 'i', 'j')} = 0;"
        )


def _points(writer: CodeWriter, scope: Scope, loops: tuple[Loop, ...], jam: bool) -> None:
    if not loops:
        _update(writer, scope, jam)
    elif len(loops) == 1 and loops[0].dim == "k":
        _dot(writer, scope)
    elif loops[0].dim == "k":
        _k_outer(writer, scope, loops[1:])
    else:
        loop, var = loops[0], loops[0].dim
        if loop.parallel:
            writer.pragma("omp parallel for schedule(static, OMP_CHUNK)")
        elif len(loops) == 1 and scope.nest.vector_bits:
            writer.pragma("omp simd")
        with writer.block(f"for (int {var} = {scope.lo(var)}; {var} < {scope.hi(var)}; {var}++)"):
            _points(writer, scope.narrowed(var, var, var).deeper(), loops[1:], jam)


def _update(writer: CodeWriter, scope: Scope, jam: bool) -> None:
    i, j, k = scope.lo("i"), scope.lo("j"), scope.lo("k")
    if not jam:
        writer.line(f"{_c(scope, i, j)} += {_a(scope, i, k)} * {_b(scope, k, j)};")
        return
    writer.line("DTYPE part = 0;")
    writer.pragma("GCC unroll 16")
    writer.line(
        "for (int u = 0; u < UNROLL_K; u++) "
        f"part += {_a(scope, i, k + ' + u')} * {_b(scope, k + ' + u', j)};"
    )
    writer.line(f"{_c(scope, i, j)} += part;")


def _k_outer(writer: CodeWriter, scope: Scope, inner: tuple[Loop, ...]) -> None:
    """A k point loop with loops inside it: C is updated in place."""
    lo, hi = scope.lo("k"), scope.hi("k")
    point = scope.narrowed("k", "k", "k").deeper()
    if scope.nest.unroll_k:
        writer.line(f"const int k_main = {lo} + ({hi} - {lo}) / UNROLL_K * UNROLL_K;")
        with writer.block(f"for (int k = {lo}; k < k_main; k += UNROLL_K)"):
            _prefetch_rows(writer, scope, inner)
            _points(writer, point, inner, jam=True)
        with writer.block(f"for (int k = k_main; k < {hi}; k++)"):
            _points(writer, point, inner, jam=False)
        return
    with writer.block(f"for (int k = {lo}; k < {hi}; k++)"):
        _prefetch_rows(writer, scope, inner)
        _points(writer, point, inner, jam=False)


def _prefetch_rows(writer: CodeWriter, scope: Scope, inner: tuple[Loop, ...]) -> None:
    """Prefetch what the k iteration PREFETCH_DIST ahead reads (a row segment of B)."""
    if not scope.nest.prefetch:
        return
    writer.line(f"const int kp = pt_min(k + PREFETCH_DIST, {scope.hi('k')} - 1);")
    dims = {loop.dim for loop in inner}
    if "j" in dims:
        writer.line(
            f"for (int jp = {scope.lo('j')}; jp < {scope.hi('j')}; jp += PT_LINE) "
            f"__builtin_prefetch(&{_b(scope, 'kp', 'jp')});"
        )
    else:
        writer.line(f"__builtin_prefetch(&{_b(scope, 'kp', scope.lo('j'))});")
    if "i" in dims:
        writer.line(
            f"for (int ip = {scope.lo('i')}; ip < {scope.hi('i')}; ip++) "
            f"__builtin_prefetch(&{_a(scope, 'ip', 'kp')});"
        )
    else:
        writer.line(f"__builtin_prefetch(&{_a(scope, scope.lo('i'), 'kp')});")


def _dot(writer: CodeWriter, scope: Scope) -> None:
    """k innermost: accumulate in a scalar, store (first visit) or add to C."""
    nest = scope.nest
    lo, hi = scope.lo("k"), scope.hi("k")
    i, j = scope.lo("i"), scope.lo("j")
    simd = "omp simd reduction(+:acc)" if nest.vector_bits else ""
    writer.line("DTYPE acc = 0;")
    if nest.unroll_k:
        writer.line(f"const int k_main = {lo} + ({hi} - {lo}) / UNROLL_K * UNROLL_K;")
        if simd:
            writer.pragma(simd)
        with writer.block(f"for (int k = {lo}; k < k_main; k += UNROLL_K)"):
            _prefetch_point(writer, scope)
            writer.line("DTYPE part = 0;")
            writer.pragma("GCC unroll 16")
            writer.line(
                "for (int u = 0; u < UNROLL_K; u++) "
                f"part += {_a(scope, i, 'k + u')} * {_b(scope, 'k + u', j)};"
            )
            writer.line("acc += part;")
        lo = "k_main"
    if simd:
        writer.pragma(simd)
    with writer.block(f"for (int k = {lo}; k < {hi}; k++)"):
        if not nest.unroll_k:
            _prefetch_point(writer, scope)
        writer.line(f"acc += {_a(scope, i, 'k')} * {_b(scope, 'k', j)};")
    out = _c(scope, i, j)
    if scope.first == "1":
        writer.line(f"{out} = acc;")
    else:
        writer.line(f"{out} = {scope.first} ? acc : {out} + acc;")


def _prefetch_point(writer: CodeWriter, scope: Scope) -> None:
    if not scope.nest.prefetch:
        return
    i, j = scope.lo("i"), scope.lo("j")
    writer.line(f"const int kp = pt_min(k + PREFETCH_DIST, {scope.hi('k')} - 1);")
    writer.line(f"__builtin_prefetch(&{_b(scope, 'kp', j)});")
    writer.line(f"__builtin_prefetch(&{_a(scope, i, 'kp')});")
