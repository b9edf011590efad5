"""Nsight Compute (ncu) over the one-shot worker: the profile evidence for a variant.

`profile_request` runs ncu on one launch of the variant's entry at the timed size and
returns the metrics of the sections that explain a kernel's speed (speed of light,
occupancy, launch statistics, warp stalls, memory tables) as a ProfileReport: every
metric as ncu printed it, and the handful a person reads first as a summary line.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from peak_tune.errors import BackendUnavailable, KernelTimeout

__all__ = ["KEY_METRICS", "STALLS", "STALL_METRIC", "ProfileReport", "find_cuda_tool",
           "parse_ncu_csv", "profile_request"]

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis")
# (ncu's metric name, how the summary line calls it)
KEY_METRICS = (
    ("Compute (SM) Throughput", "SM"),
    ("Memory Throughput", "memory"),
    ("DRAM Throughput", "DRAM"),
    ("Achieved Occupancy", "occupancy"),
    ("Registers Per Thread", "registers"),
    ("Warp Cycles Per Issued Instruction", "cycles/issue"),
    ("Executed Ipc Active", "IPC"),
    ("Duration", "duration"),
)
# Why warps did not issue, per issued instruction (ncu's WarpStateStats, as raw metrics:
# the details page shows only their sum). The summary names the largest three.
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss",
          "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
          "misc", "no_instruction", "not_selected", "selected", "short_scoreboard",
          "sleeping", "tex_throttle", "wait")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ProfileReport:
    metrics: dict[str, tuple[str, str]]  # metric name -> (value, unit)
    raw: str  # ncu's CSV

    def summary(self) -> str:
        parts = []
        for name, label in KEY_METRICS:
            if name in self.metrics:
                value, unit = self.metrics[name]
                shown = "" if unit in ("", "register/thread") else f" {unit}"
                parts.append(f"{label} {value}{shown}")
        stalls = sorted(((_number(self.metrics[STALL_METRIC.format(s)][0]), s)
                         for s in STALLS if STALL_METRIC.format(s) in self.metrics),
                        reverse=True)
        if stalls:
            parts.append("stalls per issue: " + ", ".join(f"{name} {value:.2f}"
                                                         for value, name in stalls[:3]))
        return ", ".join(parts) or "no metrics"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def find_cuda_tool(name: str) -> str:
    """A CUDA toolkit program: on PATH, else under CUDA_HOME, CUDA_PATH or /usr/local/cuda."""
    found = shutil.which(name)
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    for home in filter(None, homes):
        candidate = Path(home) / "bin" / name
        if found is None and candidate.is_file():
            found = str(candidate)
    if found is None:
        raise BackendUnavailable(f"{name} not found: install the CUDA toolkit (it ships with "
                                 f"it) or put it on PATH")
    return found


def parse_ncu_csv(text: str) -> dict[str, tuple[str, str]]:
    """Metric name -> (value, unit) from `ncu --csv --page details` (first kernel only)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    metrics: dict[str, tuple[str, str]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        name = row.get("Metric Name")
        if name and name not in metrics:
            metrics[name] = (row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return metrics


def profile_request(request_path: Path, worker_module: str, entry: str,
                    env: dict[str, str]) -> ProfileReport:
    """ncu over `python -m worker_module --one-shot request_path`, first launch of `entry`."""
    tool = find_cuda_tool("ncu")
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    stalls = ["--metrics", ",".join(STALL_METRIC.format(s) for s in STALLS)]
    try:
        return _run_ncu([tool, "--csv", "--page", "details", "--kernel-name", entry,
                         "--launch-count", "1", *sections, *stalls, sys.executable, "-m",
                         worker_module, "--one-shot", str(request_path)], env)
    except BackendUnavailable:  # an ncu that lacks a stall metric: the sections alone
        return _run_ncu([tool, "--csv", "--page", "details", "--kernel-name", entry,
                         "--launch-count", "1", *sections, sys.executable, "-m",
                         worker_module, "--one-shot", str(request_path)], env)


def _run_ncu(command: list[str], env: dict[str, str]) -> ProfileReport:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        raise KernelTimeout(f"ncu did not finish in {_TIMEOUT_S:g} s") from exc
    metrics = parse_ncu_csv(done.stdout)
    if done.returncode != 0 or not metrics:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
        raise BackendUnavailable(f"ncu failed (exit status {done.returncode}): "
                                 f"{tail[0] if tail else 'no output'}")
    return ProfileReport(metrics, done.stdout)
