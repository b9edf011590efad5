"""Print a loop nest as C: the kernel `void entry(A, B, C, M, N, K)` with DTYPE and the
tuning parameters as macros set by the tuner (-DMC=...).

The outer loops (K split, cache blocks) are printed here together with what sits
between them (packing, the first-visit flag); the innermost section is printed by
emit_points (no register tile) or emit_tile (register tile).
"""

from __future__ import annotations

from dataclasses import replace

from .emit_pack import buffer_lines, emit_pack, pack_position, slice_macros
from .emit_points import emit_point_section
from .emit_tile import emit_tile_section
from .ir import Nest
from .writer import CodeWriter, Scope, omp_for

__all__ = ["emit_source", "macros_used"]

_BLOCK_STEP = {"i": "MC", "j": "NC", "k": "KC"}
_PARALLEL = "omp parallel for schedule(static, OMP_CHUNK)"

_HELPERS = """\
static inline int pt_min(int a, int b) { return a < b ? a : b; }
static inline int pt_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static inline int pt_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
/* 64-byte aligned buffer of `count` elements; aborts when memory runs out. */
static inline DTYPE *pt_alloc(size_t count) {
    size_t bytes = (count * sizeof(DTYPE) + 63) / 64 * 64;
    if (bytes == 0) return NULL;
    DTYPE *p = aligned_alloc(64, bytes);
    if (!p) abort();
    return p;
}"""


def macros_used(nest: Nest) -> tuple[str, ...]:
    """The tuning parameters the printed code needs, in a fixed order."""
    levels = {(loop.dim, loop.level) for loop in nest.loops}
    used = []
    if any(level == "block" for _, level in levels):
        used += ["MC", "NC", "KC"]
    if nest.register_tile:
        used += ["MR", "NR"]
    if nest.unroll_k:
        used.append("UNROLL_K")
    if nest.prefetch:
        used.append("PREFETCH_DIST")
    if nest.parallel_index() is not None:
        used.append("OMP_CHUNK")
    if ("k", "split") in levels:
        used.append("K_SPLITS")
    return tuple(used)


def emit_source(nest: Nest, entry: str) -> str:
    writer = CodeWriter()
    _preamble(writer, nest)
    r = "restrict " if nest.restrict else ""
    signature = (
        f"void {entry}(const DTYPE *{r}A, const DTYPE *{r}B, DTYPE *{r}C, int M, int N, int K)"
    )
    with writer.block(signature):
        writer.line("if (M <= 0 || N <= 0) return;")
        with writer.block("if (K <= 0)"):
            writer.line("for (size_t e = 0; e < (size_t)M * N; e++) C[e] = 0;")
            writer.line("return;")
        writer.lines(*buffer_lines(nest))
        split = nest.has("k", "split")
        if split:
            writer.line("DTYPE *Cpart = pt_alloc((size_t)(K_SPLITS - 1) * M * N);")
        bounds = {"i": ("0", "M"), "j": ("0", "N"), "k": ("0", "K")}
        _loops(writer, Scope(nest, bounds), 0)
        if split:
            _reduce_splits(writer, Scope(nest, bounds))
            writer.line("free(Cpart);")
        for operand in ("A", "B"):
            if getattr(nest, f"pack_{operand.lower()}"):
                writer.line(f"free({operand}buf);")
    return writer.text()


def _preamble(writer: CodeWriter, nest: Nest) -> None:
    writer.lines(
        "/* C = A x B (row-major; A is M x K, B is K x N). DTYPE and the tuning",
        "   parameters below are set with -D by the tuner. */",
        "#include <stddef.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        "#ifdef _OPENMP",
        "#include <omp.h>",
        "#endif",
        "",
    )
    for macro in macros_used(nest):
        writer.lines(f"#ifndef {macro}", f'#error "{macro} must be defined (-D{macro}=...)"',
                     "#endif")
    writer.line("#define PT_ROUND64(x) (((size_t)(x) + 63) / 64 * 64)")
    writer.line("#define PT_LINE (64 / (int)sizeof(DTYPE)) /* elements per cache line */")
    writer.lines(*slice_macros(nest))
    if nest.vector_bits:
        writer.lines(
            f"#define PT_VBYTES {nest.vector_bits // 8} /* {nest.vector_bits}-bit vectors */",
            "#define PT_VL (PT_VBYTES / (int)sizeof(DTYPE))",
            "typedef DTYPE pt_vec __attribute__((vector_size(PT_VBYTES)));",
        )
        if nest.register_tile:
            writer.lines(
                "#define PT_NV (NR / PT_VL)",
                '_Static_assert(NR % PT_VL == 0, "NR must be a whole number of vectors");',
            )
    writer.line("")
    writer.lines(*_HELPERS.splitlines())
    writer.line("")


def _loops(writer: CodeWriter, scope: Scope, index: int) -> None:
    nest = scope.nest
    loop = nest.loops[index]
    if loop.level == "split":
        _split(writer, scope, index)
    elif loop.level == "block":
        _block(writer, scope, index)
    elif nest.register_tile:
        emit_tile_section(writer, scope, index)
    else:
        emit_point_section(writer, scope, index)


def _split(writer: CodeWriter, scope: Scope, index: int) -> None:
    if scope.nest.loops[index].parallel:
        writer.pragma(_PARALLEL)
    with writer.block("for (int s = 0; s < K_SPLITS; s++)"):
        writer.line("const int k_lo = (int)((long long)K * s / K_SPLITS);")
        writer.line("const int k_hi = (int)((long long)K * (s + 1) / K_SPLITS);")
        writer.line(f"DTYPE *{scope.restrict}Ct = s == 0 ? C : Cpart + (size_t)(s - 1) * M * N;")
        with writer.block("if (k_lo == k_hi)"):
            writer.line("for (size_t e = 0; e < (size_t)M * N; e++) Ct[e] = 0;")
            writer.line("continue;")
        inner = replace(scope.narrowed("k", "k_lo", "k_hi").deeper(), out="Ct")
        _loops(writer, inner, index + 1)


def _block(writer: CodeWriter, scope: Scope, index: int) -> None:
    nest = scope.nest
    loop = nest.loops[index]
    dim, step = loop.dim, _BLOCK_STEP[loop.dim]
    var, end = f"{dim}b", f"{dim}e"
    lo, hi = scope.lo(dim), scope.hi(dim)
    if loop.parallel:
        writer.pragma(_PARALLEL)
    with writer.block(f"for (int {var} = {lo}; {var} < {hi}; {var} += {step})"):
        writer.line(f"const int {end} = pt_min({var} + {step}, {hi});")
        inner = scope.narrowed(dim, var, end).deeper()
        if dim == "k":
            writer.line(f"const int first = kb == {lo};")
            inner = replace(inner, first="first")
        for operand in ("a", "b"):
            if pack_position(nest, operand) == index:
                emit_pack(writer, inner, operand)
        _loops(writer, inner, index + 1)


def _reduce_splits(writer: CodeWriter, scope: Scope) -> None:
    """C += every other slice's partial result."""
    omp_for(writer, scope)
    with writer.block("for (int i = 0; i < M; i++)"):
        with writer.block("for (int s = 1; s < K_SPLITS; s++)"):
            writer.line(f"const DTYPE *{scope.restrict}part = Cpart + (size_t)(s - 1) * M * N;")
            writer.line(
                "for (int j = 0; j < N; j++) C[(size_t)i * N + j] += part[(size_t)i * N + j];"
            )
