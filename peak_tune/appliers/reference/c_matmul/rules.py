"""The transformations as functions on the loop-nest IR, one per transformation id.

Each rule does to the nest what its Markdown text (transforms/c/<id>.md) tells a person
or an LLM to do to the C code, and raises InvalidPoint with a one-line reason when the
nest does not meet its precondition. Ties between parameters that exist only because of
what was applied before come back as extra constraints for the child.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from peak_tune.catalog.types import DeviceProfile
from peak_tune.errors import ApplyError, InvalidPoint

from .ir import Loop, Nest

__all__ = ["RULES", "Change", "Rule"]


@dataclass(frozen=True)
class Change:
    nest: Nest
    constraints: tuple[str, ...] = ()


Rule = Callable[[Nest, DeviceProfile], Change]

_TILE_TIES = ("MC % MR == 0", "NC % NR == 0")


def loop_interchange(nest: Nest, device: DeviceProfile) -> Change:
    """Move the k point loop outward past the j point loop directly enclosing it."""
    if nest.register_tile:
        raise InvalidPoint(
            "loop-interchange needs the j and k point loops; register-blocking replaced "
            "them by a register tile"
        )
    j, k = nest.find("j", "point"), nest.find("k", "point")
    if j is None or k is None or k != j + 1:
        raise InvalidPoint("loop-interchange needs the k point loop directly inside the j loop")
    loops = list(nest.loops)
    loops[j], loops[k] = loops[k], loops[j]
    return Change(nest.with_loops(tuple(loops)))


def cache_blocking(nest: Nest, device: DeviceProfile) -> Change:
    """Strip-mine i, j, k into block loops placed outside, in the inner loops' order."""
    if any(loop.level == "block" for loop in nest.loops):
        raise InvalidPoint("cache-blocking: the nest is already blocked")
    start = nest.first_inner_index()
    outer, inner = nest.loops[:start], nest.loops[start:]
    blocks = tuple(Loop(loop.dim, "block", loop.parallel) for loop in inner)
    inner = tuple(replace(loop, parallel=False) for loop in inner)
    constraints = _TILE_TIES if nest.register_tile else ()
    return Change(nest.with_loops(outer + blocks + inner), constraints)


def block_interchange(nest: Nest, device: DeviceProfile) -> Change:
    """Reorder the block loops to j, k, i (outer to inner); they keep their parallel flag."""
    indices = [n for n, loop in enumerate(nest.loops) if loop.level == "block"]
    if len(indices) != 3:
        raise InvalidPoint("block-interchange needs the i, j and k block loops of cache-blocking")
    by_dim = {nest.loops[n].dim: nest.loops[n] for n in indices}
    wanted = tuple(by_dim[d] for d in ("j", "k", "i"))
    if tuple(nest.loops[n] for n in indices) == wanted:
        raise InvalidPoint("block-interchange: the block loops are already in j, k, i order")
    loops = list(nest.loops)
    for n, loop in zip(indices, wanted, strict=True):
        loops[n] = loop
    return Change(nest.with_loops(tuple(loops)))


def register_blocking(nest: Nest, device: DeviceProfile) -> Change:
    """Turn the i and j point loops into MR / NR micro loops; k point loop innermost."""
    if nest.register_tile:
        raise InvalidPoint("register-blocking: the nest already has a register tile")
    if not (nest.has("i", "point") and nest.has("j", "point") and nest.has("k", "point")):
        raise InvalidPoint("register-blocking needs the i, j and k point loops")
    loops = tuple(
        Loop(loop.dim, "micro", loop.parallel) if loop.level == "point" else loop
        for loop in nest.loops
        if not (loop.dim == "k" and loop.level == "point")
    ) + (Loop("k", "point"),)
    constraints: tuple[str, ...] = ()
    if any(loop.level == "block" for loop in nest.loops):
        constraints += _TILE_TIES
    if nest.vector_bits:
        constraints += (_vector_tie(nest.vector_bits),)
    return Change(replace(nest, loops=loops, register_tile=True), constraints)


def tile_interchange(nest: Nest, device: DeviceProfile) -> Change:
    """Swap the i and j micro loops (which register tile runs inner changes)."""
    i, j = nest.find("i", "micro"), nest.find("j", "micro")
    if i is None or j is None:
        raise InvalidPoint("tile-interchange needs the MR and NR micro loops of register-blocking")
    loops = list(nest.loops)
    loops[i], loops[j] = loops[j], loops[i]
    return Change(nest.with_loops(tuple(loops)))


def pack_a(nest: Nest, device: DeviceProfile) -> Change:
    return _pack(nest, "a")


def pack_b(nest: Nest, device: DeviceProfile) -> Change:
    return _pack(nest, "b")


def _pack(nest: Nest, operand: str) -> Change:
    dims = ("i", "k") if operand == "a" else ("k", "j")
    if not all(nest.has(d, "block") for d in dims):
        raise InvalidPoint(
            f"pack-{operand} needs the {dims[0]} and {dims[1]} block loops of cache-blocking"
        )
    if getattr(nest, f"pack_{operand}"):
        raise InvalidPoint(f"pack-{operand}: {operand.upper()} is already packed")
    packed = replace(nest, pack_a=True) if operand == "a" else replace(nest, pack_b=True)
    return Change(packed)


def simd_vectorize(nest: Nest, device: DeviceProfile) -> Change:
    """Vectorise the unit-stride inner computation with the device's vector width."""
    if nest.vector_bits:
        raise InvalidPoint("simd-vectorize: the nest is already vectorised")
    bits = _vector_bits(device)
    constraints = (_vector_tie(bits),) if nest.register_tile else ()
    return Change(replace(nest, vector_bits=bits), constraints)


def unroll_k(nest: Nest, device: DeviceProfile) -> Change:
    if nest.unroll_k:
        raise InvalidPoint("unroll-k: the k loop is already unrolled")
    return Change(replace(nest, unroll_k=True))


def prefetch(nest: Nest, device: DeviceProfile) -> Change:
    if nest.prefetch:
        raise InvalidPoint("prefetch: the nest already prefetches")
    return Change(replace(nest, prefetch=True))


def restrict_align(nest: Nest, device: DeviceProfile) -> Change:
    if nest.restrict:
        raise InvalidPoint("restrict-align: the pointers are already restrict-qualified")
    return Change(replace(nest, restrict=True))


def openmp_parallel(nest: Nest, device: DeviceProfile) -> Change:
    """Mark the outermost loop that may run in parallel: the K-split loop, else i or j."""
    if nest.parallel_index() is not None:
        raise InvalidPoint("openmp-parallel: the nest already has a parallel loop")
    target = next(
        n for n, loop in enumerate(nest.loops) if loop.level == "split" or loop.dim in ("i", "j")
    )
    loops = tuple(replace(loop, parallel=n == target) for n, loop in enumerate(nest.loops))
    return Change(nest.with_loops(loops))


def k_split(nest: Nest, device: DeviceProfile) -> Change:
    """Add an outermost loop over K_SPLITS slices of K; it takes over the parallel flag."""
    if nest.has("k", "split"):
        raise InvalidPoint("k-split: K is already split")
    parallel = nest.parallel_index() is not None
    inner = tuple(replace(loop, parallel=False) for loop in nest.loops)
    return Change(nest.with_loops((Loop("k", "split", parallel),) + inner))


def _vector_bits(device: DeviceProfile) -> int:
    value = device.facts.get("vector_bits")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 64 or value & (value - 1):
        raise ApplyError(
            f"simd-vectorize needs the device fact vector_bits as a power-of-two bit count "
            f"(device {device.name!r} has {value!r})"
        )
    return value


def _vector_tie(bits: int) -> str:
    """NR must be a whole number of vectors of the narrowest element type (float)."""
    return f"NR % {bits // 32} == 0"


RULES: Mapping[str, Rule] = {
    "loop-interchange": loop_interchange,
    "cache-blocking": cache_blocking,
    "block-interchange": block_interchange,
    "register-blocking": register_blocking,
    "tile-interchange": tile_interchange,
    "pack-a": pack_a,
    "pack-b": pack_b,
    "simd-vectorize": simd_vectorize,
    "unroll-k": unroll_k,
    "prefetch": prefetch,
    "restrict-align": restrict_align,
    "openmp-parallel": openmp_parallel,
    "k-split": k_split,
}
