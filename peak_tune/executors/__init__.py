"""Executors: where the evaluations of a tuning run take place (this process, or Ray)."""

from __future__ import annotations

import os
import shutil
import subprocess

from peak_tune.backends import capabilities
from peak_tune.errors import UserError
from peak_tune.executors.base import EvalJob, Executor
from peak_tune.executors.local import LocalExecutor

__all__ = ["EvalJob", "Executor", "LocalExecutor", "choose_executor", "gpu_count"]

EXECUTORS = ("auto", "local", "ray")


def choose_executor(asked: str, ray_address: str | None, backend_name: str) -> str:
    """local or ray: auto means ray with a Ray address or more than one GPU here."""
    if asked not in EXECUTORS:
        raise UserError(f"unknown executor {asked!r} (choose {', '.join(EXECUTORS)})")
    if asked != "auto":
        return asked
    if ray_address or (not capabilities(backend_name).on_host and gpu_count() > 1):
        return "ray"
    return "local"


def gpu_count() -> int:
    """NVIDIA GPUs this process may use (nvidia-smi's list, limited by
    CUDA_VISIBLE_DEVICES); 0 without a driver."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))
