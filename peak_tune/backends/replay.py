"""Replay backend: answers evaluations from a recording of real ones.

A recording holds measured outcomes keyed by (sequence, parameter values, size), made by
`peak_tune.session.recording.record_space` with a real backend. Replaying it runs a search in
seconds and exactly the same way every time, which is how search strategies are
compared and how the search logic is tested. A point the recording lacks is an error:
nothing is invented, unless the recording says it is `partial`.

A partial recording (`benchmarks/record_landscape.py`: every point some real GPU studies
evaluated, a few thousand of a space far too large to enumerate) answers a point it lacks
with its nearest recorded point that ran (a nearest-neighbour surrogate, as tabular
hyperparameter benchmarks do): nearest by steps not shared, then steps out of place,
then tuning values apart in octaves. `surrogate_fidelity` says how well that predicts
the recorded points themselves.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peak_tune.backends import capabilities
from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize, stable_hash
from peak_tune.errors import (
    CompileError,
    InvalidPoint,
    KernelCrash,
    KernelTimeout,
    UserError,
    WrongResult,
)

__all__ = ["ReplayBackend", "point_distance", "replay_key", "surrogate_fidelity"]

_ERRORS = {
    "invalid": InvalidPoint,  # refused by the backend when recorded (e.g. out of registers)
    "compile_error": CompileError,
    "crash": KernelCrash,
    "timeout": KernelTimeout,
    "wrong_result": WrongResult,
}


# a step one point has and the other lacks weighs as much as a tile three octaves apart
_STEP_WEIGHT = 3.0


def point_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far apart two recorded points are (`sequence` and `params` of each)."""
    steps_a, steps_b = list(a["sequence"]), list(b["sequence"])
    unshared = len(set(steps_a) ^ set(steps_b))
    shared_a = [s for s in steps_a if s in steps_b]
    shared_b = [s for s in steps_b if s in steps_a]
    out_of_place = sum(x != y for x, y in zip(shared_a, shared_b, strict=True))
    values_a, values_b = a["params"], b["params"]
    apart = 0.0
    for name in values_a.keys() | values_b.keys():
        if name in values_a and name in values_b:
            apart += abs(math.log2(1 + abs(values_a[name])) - math.log2(1 + abs(values_b[name])))
        else:
            apart += 1.0
    return _STEP_WEIGHT * unshared + out_of_place + apart


def _nearest(point: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]
             ) -> Mapping[str, Any]:
    return min(candidates, key=lambda c: point_distance(point, c))


def _ran(outcomes: Sequence[Mapping[str, Any]], size: str) -> list[Mapping[str, Any]]:
    """The recorded points at `size` that reached the device (not refused at build)."""
    return [o for o in outcomes if o["size"] == size and o["status"] != "invalid"]


def surrogate_fidelity(outcomes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Leave-one-out: each recorded point that ran well, predicted from the others by the
    nearest-neighbour surrogate. Spearman's rank correlation of predicted and recorded
    speed, and the share of predictions within 10% of the recorded speed."""
    ok = [o for o in outcomes if o["status"] == "ok"]
    if len(ok) < 3:
        return {"points": len(ok), "spearman": 0.0, "within_10pct": 0.0}
    speed = [o["flops"] / o["samples_ms"][0] for o in ok]
    predicted = []
    for i, point in enumerate(ok):
        others = [o for j, o in enumerate(ok) if j != i and o["size"] == point["size"]]
        near = _nearest(point, others)
        predicted.append(near["flops"] / near["samples_ms"][0])
    return {"points": len(ok), "spearman": _spearman(speed, predicted),
            "within_10pct": sum(abs(p / s - 1) <= 0.1 for p, s in zip(predicted, speed,
                                                                       strict=True)) / len(ok)}


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else 0.0


def replay_key(sequence: tuple[str, ...] | list[str], params: Mapping[str, int],
               size: str) -> str:
    return stable_hash([list(sequence), dict(sorted(params.items())), size])


class ReplayBackend:
    """Stands in for the backend that made the recording (its `name` is that backend's)."""

    def __init__(self, device: DeviceProfile, recording: Path) -> None:
        try:
            data: dict[str, Any] = json.loads(recording.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read recording {recording}: {exc}") from exc
        self.name = str(data.get("backend", "c"))
        self.capabilities = dataclasses.replace(capabilities(self.name), sanitizer=False,
                                                profiler=False)
        self.device = device
        self.recording = recording
        self.data = data
        self.outcomes = {
            replay_key(o["sequence"], o["params"], o["size"]): o for o in data["outcomes"]
        }
        self.partial = bool(data.get("partial", False))
        self._answered: dict[str, Mapping[str, Any]] = {}  # a partial one's surrogate picks
        self._ran: dict[str, list[Mapping[str, Any]]] = {}  # size -> its points that ran
        self.calls = 0

    def probe(self) -> DeviceProfile:
        return self.device

    def fingerprint(self) -> Mapping[str, str]:
        return {"replay": stable_hash(self.data)}

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        key = stable_hash([context.content_hash(), dict(params), dtype])
        return Artifact(path="", compile_key=key)

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        self.calls += 1
        key = replay_key(request.context.applied, request.params, request.size.label())
        outcome = self.outcomes.get(key) or self._answered.get(key)
        if outcome is None:
            point = {"sequence": request.context.applied, "params": request.params}
            size = request.size.label()
            candidates = self._ran.setdefault(size, _ran(self.data["outcomes"], size))
            if not self.partial or not candidates:
                raise UserError(
                    f"recording {self.recording.name} has no outcome for "
                    f"{' > '.join(request.context.applied) or 'seed'} "
                    f"{dict(request.params)} at {request.size.label()}")
            outcome = self._answered[key] = _nearest(point, candidates)
        if outcome["status"] != "ok":
            raise _ERRORS[outcome["status"]](outcome.get("message", outcome["status"]))
        return Measurement(tuple(outcome["samples_ms"]), float(outcome["flops"]))

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        vendor = self.data["vendor"][size.label()]
        return vendor["name"], Measurement(tuple(vendor["samples_ms"]), float(vendor["flops"]))

    def close(self) -> None:
        pass
