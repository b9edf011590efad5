"""`peak-tune dry-run`: compile-check a study's space for a device, with nothing run.

The points are what a study would build: each transformation after the shortest
sequence that allows it (its requirements), then random legal sequences (steps drawn
in an order their requires/conflicts allow, as the search's encodings do) at random
parameter values that meet the variant's constraints. Each is built by the device's
backend with the reference applier, so on a machine without the GPU a user sees what
would run: the compiled resources per point (registers, shared memory / LDS, spills,
occupancy), the points the backend would prune and why, and any point that fails to
compile (a transformation's bug: exit status 1).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.backends.base import Backend
from peak_tune.catalog.sequences import legal_next
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext, KernelSpec
from peak_tune.errors import (
    ApplyError,
    BuildOverBudget,
    CompileError,
    ExpressionError,
    InvalidPoint,
)
from peak_tune.evaluation.pipeline import seed_context
from peak_tune.expr import evaluate_bool, evaluate_int

__all__ = ["DryRunPoint", "check_space", "space_points"]

_VALUE_TRIES = 50  # random draws of a point's values before giving up on its constraints


@dataclass
class DryRunPoint:
    """One point of the space and what building it said."""

    sequence: tuple[str, ...]
    params: dict[str, int]
    outcome: str = ""  # "ok", "pruned", "compile error", "no legal values"
    message: str = ""
    resources: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"sequence": list(self.sequence), "params": self.params,
                "outcome": self.outcome, "message": self.message,
                "resources": self.resources}


def space_points(spec: KernelSpec, backend: str, device: DeviceProfile,
                 transformations: Mapping[str, Transformation], count: int, seed: int
                 ) -> Iterator[tuple[KernelContext, dict[str, int] | None]]:
    """(variant, values) for the seed, each transformation after its requirements, then
    `count` random legal sequences; values None where no draw met the constraints."""
    applier = ReferenceApplier()
    rng = random.Random(seed)
    start = seed_context(spec, backend)
    seen: set[str] = set()
    sequences = [[*_prefix(tid, transformations), tid] for tid in sorted(transformations)]
    for sequence in [[], *sequences, *(_random_sequence(transformations, rng)
                                       for _ in range(count))]:
        context = start
        for tid in sequence:
            try:
                context = applier.apply(context, transformations[tid], device)
            except (InvalidPoint, ApplyError):
                break  # a random walk's step that cannot follow: stop it there
        if context.content_hash() in seen:
            continue
        seen.add(context.content_hash())
        yield context, _legal_values(context, rng,
                                     int(device.facts.get("max_threads_per_block", 1024)))


def check_space(backend: Backend, device: DeviceProfile, spec: KernelSpec, backend_name: str,
                transformations: Mapping[str, Transformation], dtype: str, count: int,
                seed: int) -> list[DryRunPoint]:
    """Build every point of space_points with `backend`; what each build said."""
    found = []
    with tempfile.TemporaryDirectory(prefix="peak-tune-dry-run-") as build_dir:
        for context, values in space_points(spec, backend_name, device, transformations,
                                            count, seed):
            point = DryRunPoint(context.applied, dict(values or {}))
            found.append(point)
            if values is None:
                point.outcome, point.message = "no legal values", " and ".join(
                    context.constraints)
                continue
            try:
                artifact = backend.compile(context, values, dtype, build_dir)
            except InvalidPoint as exc:
                point.outcome, point.message = "pruned", str(exc)
            except (CompileError, BuildOverBudget, ApplyError) as exc:
                point.outcome, point.message = "compile error", str(exc)
            else:
                point.outcome, point.resources = "ok", dict(artifact.resources)
    return found


def _prefix(tid: str, transformations: Mapping[str, Transformation]) -> list[str]:
    """The shortest sequence meeting `tid`'s requirements, in a legal order."""
    prefix: list[str] = []
    for required in transformations[tid].requires:
        for step in [*_prefix(required, transformations), required]:
            if step not in prefix:
                prefix.append(step)
    return prefix


def _random_sequence(transformations: Mapping[str, Transformation],
                     rng: random.Random) -> list[str]:
    """Steps in random order, each one whose requirements are met and that clashes with
    none taken, as long as the draw goes on."""
    taken: list[str] = []
    length = rng.randint(1, len(transformations))
    while len(taken) < length:
        allowed = legal_next(taken, transformations)
        if not allowed:
            break
        taken.append(rng.choice(allowed))
    return taken


def _legal_values(context: KernelContext, rng: random.Random, max_threads: int
                  ) -> dict[str, int] | None:
    """Random values of the variant's parameters meeting its constraints and giving a
    block of at most `max_threads` (a search drops the others before building), or None."""
    block = [context.launch.get(k, "1") for k in ("block_x", "block_y", "block_z")]
    for _ in range(_VALUE_TRIES):
        values = {p.name: rng.choice(p.values) for p in context.params}
        try:
            threads = 1
            for extent in block:
                threads *= evaluate_int(extent, values)
            if threads <= max_threads and all(evaluate_bool(c, values)
                                              for c in context.constraints):
                return values
        except ExpressionError:
            return values  # a constraint on the sizes: the backend checks it per size
    return None


def print_points(points: list[DryRunPoint], device: DeviceProfile) -> None:
    """A table: outcome, the main resources, the sequence and values, one line each."""
    keys = ("vgprs", "agprs", "sgprs", "lds_bytes", "scratch_bytes", "occupancy_waves",
            "registers", "shared_static_bytes", "spills")
    for point in points:
        shown = " ".join(f"{k}={point.resources[k]}" for k in keys if k in point.resources)
        steps = " > ".join(point.sequence) or "(seed)"
        values = " ".join(f"{k}={v}" for k, v in sorted(point.params.items()))
        detail = shown if point.outcome == "ok" else point.message.splitlines()[0][:160]
        print(f"{point.outcome:<15} {steps}  [{values}]  {detail}")
    counts: dict[str, int] = {}
    for point in points:
        counts[point.outcome] = counts.get(point.outcome, 0) + 1
    print(f"{device.name} ({device.facts.get('arch', '')}): {len(points)} points: "
          + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
