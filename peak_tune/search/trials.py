"""What one trial did, as the session tells it to the study and the views show it; and
the trial's attributes in the study (Optuna's user_attrs), written and read here only.

The keys are the storage's: studies written by earlier versions read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from peak_tune.core import Status

__all__ = ["INTERRUPTED", "TrialAttrs", "TrialRecord", "write_interrupted", "write_record",
           "write_seconds", "write_timing", "write_variant"]

INTERRUPTED = "interrupted"  # the status of a trial a stopped run cut short
_MESSAGE_CHARS = 500


@dataclass(frozen=True)
class TrialRecord:
    number: int
    status: Status
    sequence: tuple[str, ...]
    params: dict[str, int]
    gflops: float
    message: str
    cached: bool
    seconds: float


class _Settable(Protocol):
    @property
    def user_attrs(self) -> Mapping[str, Any]: ...

    def set_user_attr(self, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class TrialAttrs:
    """A trial's attributes as the study holds them; `of` reads them (with the
    defaults of a trial that never got so far), the write_* functions set them."""

    status: str = ""  # a Status value, INTERRUPTED, or "" (never told)
    sequence: tuple[str, ...] = ()
    params: dict[str, int] = field(default_factory=dict)
    message: str = ""
    cached: bool = False  # answered by the evaluation cache
    context_hash: str = ""  # the variant's (evaluation.cache)
    gflops_by_size: dict[str, float] = field(default_factory=dict)
    spread: float = 0.0  # the widest timing spread over the sizes
    noisy: bool = False  # a timing stayed noisy after re-measuring: never cached
    remeasured: int = 0  # timings measured again for their spread
    seconds: dict[str, float] = field(default_factory=dict)  # where the trial's time went

    @classmethod
    def of(cls, trial: Any) -> TrialAttrs:
        attrs: Mapping[str, Any] = trial.user_attrs
        seconds = attrs.get("seconds", {})
        return cls(status=str(attrs.get("status", "")),
                   sequence=tuple(attrs.get("sequence", ())),
                   params=dict(attrs.get("params", {})),
                   message=str(attrs.get("message", "")),
                   cached=bool(attrs.get("cached", False)),
                   context_hash=str(attrs.get("context_hash", "")),
                   gflops_by_size={str(k): float(v)
                                   for k, v in dict(attrs.get("gflops", {})).items()},
                   spread=float(attrs.get("spread", 0.0)),
                   noisy=bool(attrs.get("noisy", False)),
                   remeasured=int(attrs.get("remeasured", 0)),
                   seconds={str(k): float(v) for k, v in seconds.items()}
                   if isinstance(seconds, dict) else {})

    @property
    def interrupted(self) -> bool:
        return self.status == INTERRUPTED


def write_record(trial: _Settable, record: TrialRecord) -> None:
    """What every told trial carries: its outcome, sequence, values and message."""
    trial.set_user_attr("status", record.status.value)
    trial.set_user_attr("sequence", list(record.sequence))
    trial.set_user_attr("params", record.params)
    if record.message:
        trial.set_user_attr("message", record.message[:_MESSAGE_CHARS])
    trial.set_user_attr("cached", record.cached)


def write_interrupted(trial: _Settable, reason: str) -> bool:
    """A trial the run stopped in, unless it was told already; whether it was marked."""
    if "status" in trial.user_attrs:
        return False
    trial.set_user_attr("status", INTERRUPTED)
    trial.set_user_attr("message", reason[:_MESSAGE_CHARS])
    return True


def write_variant(trial: _Settable, context_hash: str) -> None:
    trial.set_user_attr("context_hash", context_hash)


def write_timing(trial: _Settable, gflops_by_size: Mapping[str, float], spread: float,
                 noisy: bool, remeasured: int) -> None:
    trial.set_user_attr("gflops", dict(gflops_by_size))
    trial.set_user_attr("spread", spread)
    trial.set_user_attr("noisy", noisy)  # a noisy trial is not cached
    if remeasured:
        trial.set_user_attr("remeasured", remeasured)


def write_seconds(trial: _Settable, seconds: Mapping[str, float]) -> None:
    trial.set_user_attr("seconds", dict(seconds))
