"""Replay backend: answers evaluations from a recording of real ones.

A recording holds measured outcomes keyed by (sequence, parameter values, size), made by
`peak_tune.session.recording.record_space` with a real backend. Replaying it runs a search in
seconds and exactly the same way every time, which is how search strategies are
compared and how the search logic is tested. A point the recording lacks is an error:
nothing is invented.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from peak_tune.backends import capabilities
from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize, stable_hash
from peak_tune.errors import (
    CompileError,
    KernelCrash,
    KernelTimeout,
    UserError,
    WrongResult,
)

__all__ = ["ReplayBackend", "replay_key"]

_ERRORS = {
    "compile_error": CompileError,
    "crash": KernelCrash,
    "timeout": KernelTimeout,
    "wrong_result": WrongResult,
}


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
        if key not in self.outcomes:
            raise UserError(
                f"recording {self.recording.name} has no outcome for "
                f"{' > '.join(request.context.applied) or 'seed'} {dict(request.params)} "
                f"at {request.size.label()}"
            )
        outcome = self.outcomes[key]
        if outcome["status"] != "ok":
            raise _ERRORS[outcome["status"]](outcome.get("message", outcome["status"]))
        return Measurement(tuple(outcome["samples_ms"]), float(outcome["flops"]))

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        vendor = self.data["vendor"][size.label()]
        return vendor["name"], Measurement(tuple(vendor["samples_ms"]), float(vendor["flops"]))

    def close(self) -> None:
        pass
