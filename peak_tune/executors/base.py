"""The Executor seam: the driver hands over points to evaluate and gets Outcomes back.

The driver alone asks and tells the study; an executor builds, validates and times. A
job is a plain frozen value, so that it can cross to another process or node.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from peak_tune.core import KernelContext, Outcome, ProblemSize

__all__ = ["EvalJob", "Executor"]


@dataclass(frozen=True)
class EvalJob:
    """One point: a variant and its parameter values, evaluated at each tuned size.

    A size whose first run is slower than its `slow_cutoff_ms` (0: none) is timed once.
    """

    context: KernelContext
    params: Mapping[str, int]
    sizes: tuple[ProblemSize, ...]
    slow_cutoff_ms: tuple[float, ...]


class Executor(Protocol):
    name: str

    @property
    def slots(self) -> int:
        """Jobs worth keeping in flight: enough to keep every device busy."""
        ...

    def submit(self, job: EvalJob) -> Future[list[Outcome]]:
        """Start evaluating; the future holds one Outcome per size, in order. Failures of
        the kernel are Outcomes; the future raises only for the run's own errors."""
        ...

    def close(self) -> None:
        """Wait for running jobs, cancel queued ones, release devices and workers."""
        ...
