"""Local search around the best trials: neighbours that move tuning values one step.

TPE is good at choosing among sequences and poor at the last few percent inside one:
in a branch whose constraints tie its values together (wgmma's tile, warpgroup and
stage counts) most of its draws are pruned, and the best points are found by hand one
step away from where it stopped. So whenever a trial ranks among the best so far, its
neighbours are queued: the same sequence (every `use.`/`pos.` parameter as it was) with
one tuning value moved to the next declared value up or down, or, where the constraints
tie it to another, two values moved together. Only neighbours that satisfy the variant's
constraints are queued, none twice. A trial pruned because its values break the
constraints is repaired the same way: the valid point fewest steps from it is queued
first, so the sampler's wish is evaluated rather than lost (in the wgmma branch more than
half of TPE's draws were pruned). With the subset encoding, a best trial's sequence also
has neighbours: the same trial with one transformation dropped, or with one added at the
end (one whose requirements are in the sequence and that conflicts with none of it; the
sampler draws its tuning values). An add-on that is worth a few percent on the best
kernel (interior-tiles on search-8's fp32 kernel: 0.872x -> 0.915x cuBLAS) is otherwise
left to TPE's one-in-two draw of `use.<id>` inside a branch it rarely revisits.
The trial loop takes a `share` of its trials from
this queue (enqueued, so Optuna records them and TPE learns from them); asking for one
costs no sampling, which is also what lets a study keep several GPUs busy when the
sampler itself is the slowest part of the driver.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from peak_tune.catalog.sequences import why_illegal
from peak_tune.catalog.types import Transformation
from peak_tune.core import KernelContext, ParamDomain
from peak_tune.expr import evaluate_bool
from peak_tune.search.space import param_key

__all__ = ["Neighbour", "Polisher", "nearest_valid", "neighbours", "step_neighbours"]

_QUEUE_LIMIT = 64  # neighbours waiting; the oldest (of earlier bests) are dropped first


@dataclass(frozen=True)
class Neighbour:
    params: dict[str, Any]  # every Optuna parameter of the trial to enqueue
    origin: int  # the trial it is a neighbour of
    moved: str  # e.g. "tb-tiling.TILE_K_SIZE 32->64"


def _satisfies(variant: KernelContext, values: Mapping[str, int]) -> bool:
    return all(evaluate_bool(c, values) for c in variant.constraints)


def _steps(domain: ParamDomain, value: int) -> Iterator[int]:
    """The declared values next to `value`, down then up."""
    ordered = sorted(domain.values)
    at = bisect.bisect_left(ordered, value)
    for index in (at - 1, at + 1):
        if 0 <= index < len(ordered) and ordered[index] != value:
            yield ordered[index]


def _tunable(variant: KernelContext, values: Mapping[str, int]) -> list[ParamDomain]:
    return [d for d in variant.params if len(d.values) > 1 and d.name in values]


def neighbours(variant: KernelContext, values: Mapping[str, int]) -> Iterator[
        tuple[dict[str, int], str]]:
    """Values one step from `values` that satisfy `variant`'s constraints: each value
    moved alone, then (for a move the constraints forbid alone) together with one step
    of another value."""
    domains = _tunable(variant, values)
    for domain in domains:
        for value in _steps(domain, values[domain.name]):
            moved = {**values, domain.name: value}
            what = f"{param_key(domain)} {values[domain.name]}->{value}"
            if _satisfies(variant, moved):
                yield moved, what
                continue
            pair = next(((other, second) for other in domains if other is not domain
                         for second in _steps(other, values[other.name])
                         if _satisfies(variant, {**moved, other.name: second})), None)
            if pair is not None:
                other, second = pair
                yield ({**moved, other.name: second},
                       f"{what}, {param_key(other)} {values[other.name]}->{second}")


def step_neighbours(params: Mapping[str, Any], transformations: Mapping[str, Transformation]
                    ) -> Iterator[tuple[dict[str, Any], str]]:
    """Subset-encoded trial parameters (`use.<id>`, `pos.<id>`, `<id>.<MACRO>`) with one
    transformation dropped (its position and values with it) or added last (pos 1.0; its
    values left to the sampler), where its requirements are used and no conflict is."""
    used = {tid for tid in transformations if params.get(f"use.{tid}")}
    for tid in sorted(transformations):
        if f"use.{tid}" not in params:
            continue  # not a subset-encoded trial, or a study with another catalog
        if tid in used:
            dropped = {k: v for k, v in params.items()
                       if k != f"pos.{tid}" and not k.startswith(f"{tid}.")}
            yield {**dropped, f"use.{tid}": False}, f"without {tid}"
            continue
        if not why_illegal(sorted(used), tid, transformations):  # it may come last
            yield {**params, f"use.{tid}": True, f"pos.{tid}": 1.0}, f"with {tid}"


def nearest_valid(variant: KernelContext, values: Mapping[str, int], most_moves: int = 3,
                  most_points: int = 5000) -> tuple[dict[str, int], str] | None:
    """The values fewest steps from `values` (at most `most_moves`) that satisfy the
    constraints, ties in declaration order; None if `values` already do, or none is
    found within the bounds."""
    if _satisfies(variant, values):
        return None
    domains = _tunable(variant, values)
    frontier: list[dict[str, int]] = [dict(values)]
    seen = {tuple(sorted(values.items()))}
    for _ in range(most_moves):
        following: list[dict[str, int]] = []
        for point in frontier:
            for domain in domains:
                for value in _steps(domain, point[domain.name]):
                    moved = {**point, domain.name: value}
                    key = tuple(sorted(moved.items()))
                    if key in seen:
                        continue
                    if _satisfies(variant, moved):
                        changes = ", ".join(f"{param_key(d)} {values[d.name]}->{moved[d.name]}"
                                            for d in domains if moved[d.name] != values[d.name])
                        return moved, f"repaired: {changes}"
                    seen.add(key)
                    following.append(moved)
                    if len(seen) > most_points:
                        return None
        frontier = following
    return None


class Polisher:
    """Queues the neighbours of trials that rank among the `top` best so far and hands
    them out for a `share` of the trials."""

    def __init__(self, share: float, top: int = 3,
                 transformations: Mapping[str, Transformation] | None = None) -> None:
        if not 0.0 <= share < 1.0:
            raise ValueError("the polish share must be at least 0 and below 1")
        self.share = share
        self.top = top
        self.transformations = transformations or {}  # for step neighbours (subset only)
        self._best: list[float] = []  # the best `top` values so far, ascending
        self._queue: list[Neighbour] = []
        self._seen: set[tuple[tuple[str, Any], ...]] = set()
        self._asked = 0
        self._given = 0

    def saw(self, params: Mapping[str, Any]) -> None:
        """A trial with these Optuna parameters exists: never queue it again."""
        self._seen.add(tuple(sorted(params.items())))

    def offer(self, number: int, params: Mapping[str, Any], variant: KernelContext,
              values: Mapping[str, int], gflops: float) -> int:
        """A finished trial; if it ranks among the best, queue its neighbours first.
        Returns how many were queued."""
        self.saw(params)
        if len(self._best) >= self.top and gflops <= self._best[0]:
            return 0
        bisect.insort(self._best, gflops)
        del self._best[:-self.top]
        fresh = [n for moved, what in neighbours(variant, values)
                 if (n := self._unseen(number, params, variant, moved, what)) is not None]
        for candidate, what in step_neighbours(params, self.transformations):
            if (n := self._unseen_params(number, candidate, what)) is not None:
                fresh.append(n)
        self._queue_first(fresh)
        return len(fresh)

    def repair(self, number: int, params: Mapping[str, Any], variant: KernelContext,
               values: Mapping[str, int]) -> bool:
        """A trial pruned because its values break the constraints: queue the valid
        point nearest to what the sampler wanted, ahead of everything else."""
        self.saw(params)
        found = nearest_valid(variant, values)
        if found is None:
            return False
        neighbour = self._unseen(number, params, variant, *found)
        self._queue_first([neighbour] if neighbour is not None else [])
        return neighbour is not None

    def _unseen(self, number: int, params: Mapping[str, Any], variant: KernelContext,
                moved: Mapping[str, int], what: str) -> Neighbour | None:
        """The trial `params` with the values `moved`, unless that point was seen."""
        by_name = {d.name: param_key(d) for d in variant.params}
        candidate = {**params, **{by_name[n]: v for n, v in moved.items()}}
        return self._unseen_params(number, candidate, what)

    def _unseen_params(self, number: int, candidate: dict[str, Any],
                       what: str) -> Neighbour | None:
        key = tuple(sorted(candidate.items()))
        if key in self._seen:
            return None
        self._seen.add(key)
        return Neighbour(candidate, number, what)

    def _queue_first(self, fresh: list[Neighbour]) -> None:
        self._queue[:0] = fresh
        del self._queue[_QUEUE_LIMIT:]

    def next(self) -> Neighbour | None:
        """The neighbour for the next trial, when polishing is due; else None (TPE)."""
        self._asked += 1
        if not self._queue or self._given >= self.share * self._asked:
            return None
        self._given += 1
        return self._queue.pop(0)
