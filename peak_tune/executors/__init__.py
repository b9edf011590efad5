"""Executors: where the evaluations of a tuning run take place (this process, or Ray)."""

from __future__ import annotations

from peak_tune.executors.base import EvalJob, Executor
from peak_tune.executors.local import LocalExecutor

__all__ = ["EvalJob", "Executor", "LocalExecutor"]
