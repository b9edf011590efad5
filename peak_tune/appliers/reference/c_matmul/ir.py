"""A loop-nest IR for C = A x B, and its JSON form (kept in KernelContext.state).

The nest is an ordered list of loops, outer to inner. Each loop runs over one
dimension (i: rows of C and A, j: columns of C and B, k: the reduction) at one level:

- "split": K cut into K_SPLITS slices, each summed into its own partial C (k only);
- "block": a cache-block loop stepping MC, NC or KC;
- "micro": a register-tile loop stepping MR or NR (i and j only, after register blocking);
- "point": one element per iteration.

Within a dimension, coarser levels are outside finer ones. Without a register tile the
three point loops are innermost, in any order; with one, the i and j point loops are gone
(their micro loops stand where they were), the k point loop is innermost, and an
MR x NR tile of accumulators is the loop body. Facts that are not loops (packed panels,
vector width, restrict, prefetch, unrolling) are fields of the nest; the code generator
decides from the whole nest where each one takes effect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from peak_tune.errors import ApplyError

from ..change import read_state

__all__ = ["DIMS", "FORMAT", "LEVELS", "Loop", "Nest", "dump_nest", "load_nest"]

FORMAT = "peak-tune/reference/c-matmul/1"
DIMS = ("i", "j", "k")
LEVELS = ("split", "block", "micro", "point")


@dataclass(frozen=True)
class Loop:
    dim: str  # "i" | "j" | "k"
    level: str  # one of LEVELS
    parallel: bool = False  # iterations shared among OpenMP threads


@dataclass(frozen=True)
class Nest:
    """The kernel's loop nest and the facts that shape its code."""

    loops: tuple[Loop, ...]
    register_tile: bool = False  # MR x NR accumulators innermost (register-blocking)
    pack_a: bool = False  # A blocks copied to a contiguous buffer (pack-a)
    pack_b: bool = False  # B blocks copied to a contiguous buffer (pack-b)
    vector_bits: int = 0  # 0: scalar; else the vector width in bits (simd-vectorize)
    unroll_k: bool = False  # the k point loop unrolled by UNROLL_K (unroll-k)
    prefetch: bool = False  # operands prefetched PREFETCH_DIST k steps ahead (prefetch)
    restrict: bool = False  # restrict pointers, aligned packed buffers (restrict-align)

    # ---------------------------------------------------------------- queries
    def find(self, dim: str, level: str) -> int | None:
        """Index of the loop over `dim` at `level`, or None."""
        return next(
            (n for n, loop in enumerate(self.loops) if loop.dim == dim and loop.level == level),
            None,
        )

    def has(self, dim: str, level: str) -> bool:
        return self.find(dim, level) is not None

    def parallel_index(self) -> int | None:
        return next((n for n, loop in enumerate(self.loops) if loop.parallel), None)

    def first_inner_index(self) -> int:
        """Index of the first micro or point loop (where the inner section starts)."""
        return next(
            n for n, loop in enumerate(self.loops) if loop.level in ("micro", "point")
        )

    def with_loops(self, loops: tuple[Loop, ...]) -> Nest:
        return replace(self, loops=loops)


def dump_nest(nest: Nest) -> str:
    """The nest as canonical JSON (sorted keys, no spaces)."""
    payload: dict[str, Any] = {
        "format": FORMAT,
        "loops": [[loop.dim, loop.level, loop.parallel] for loop in nest.loops],
        "register_tile": nest.register_tile,
        "pack_a": nest.pack_a,
        "pack_b": nest.pack_b,
        "vector_bits": nest.vector_bits,
        "unroll_k": nest.unroll_k,
        "prefetch": nest.prefetch,
        "restrict": nest.restrict,
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


_FLAGS = ("register_tile", "pack_a", "pack_b", "unroll_k", "prefetch", "restrict")


def load_nest(text: str) -> Nest:
    """Parse a state written by dump_nest; ApplyError if it is not one."""
    payload = read_state(text, FORMAT)
    try:
        loops = tuple(_loop(entry) for entry in payload["loops"])
        flags = {name: payload[name] for name in _FLAGS}
        vector_bits = payload["vector_bits"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ApplyError(f"reference applier state is malformed: {exc}") from exc
    if not all(isinstance(v, bool) for v in flags.values()) or not isinstance(vector_bits, int):
        raise ApplyError("reference applier state is malformed: wrong field types")
    nest = Nest(loops=loops, vector_bits=vector_bits, **flags)
    if dump_nest(nest) != text:
        raise ApplyError("reference applier state is not in canonical form")
    problem = _structure_problem(nest)
    if problem:
        raise ApplyError(f"reference applier state is not a valid nest: {problem}")
    return nest


def _structure_problem(nest: Nest) -> str:
    """What breaks the nest's invariants (see the module docstring), or ""."""
    rank = {level: n for n, level in enumerate(LEVELS)}
    for dim in DIMS:
        levels = [rank[loop.level] for loop in nest.loops if loop.dim == dim]
        if levels != sorted(set(levels)):
            return f"the {dim} loops are not nested coarse to fine"
        if not levels or levels[-1] < rank["micro"]:
            return f"no innermost {dim} loop"
    outer = [loop.level in ("split", "block") for loop in nest.loops]
    if outer != sorted(outer, reverse=True):
        return "a split or block loop lies inside a micro or point loop"
    micro = {loop.dim for loop in nest.loops if loop.level == "micro"}
    if micro not in (set(), {"i", "j"}) or bool(micro) != nest.register_tile:
        return "micro loops and register_tile disagree"
    if nest.register_tile and nest.loops[-1] != Loop("k", "point"):
        return "the k point loop is not innermost under a register tile"
    if sum(loop.parallel for loop in nest.loops) > 1:
        return "more than one parallel loop"
    if any(loop.level == "split" for loop in nest.loops[1:]):
        return "the K split loop is not outermost"
    return ""


def _loop(entry: Any) -> Loop:
    dim, level, parallel = entry
    if dim not in DIMS or level not in LEVELS or not isinstance(parallel, bool):
        raise ValueError(f"bad loop {entry!r}")
    return Loop(dim, level, parallel)
