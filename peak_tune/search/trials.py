"""What one trial did, as the session tells it to the study and the views show it."""

from __future__ import annotations

from dataclasses import dataclass

from peak_tune.core import Status

__all__ = ["TrialRecord"]


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
