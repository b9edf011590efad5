"""Runs the suite's kernels through the real CLI, each as a user's own seed kernel.

Every kernel becomes a seed of a throwaway catalog (`seeds/adv_<name>/`, the built-in
matmul spec with the kernel as `naive.c`); `peak-tune batch` runs one study of one
trial (the seed) per kernel, each study with a fresh worker, and a kernel marked
`alone` gets a `peak-tune tune` of its own. What a user would see comes back: the
trial's outcome and speed from the CLI's JSON summary.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.adversarial.cases import MARK_DIR, Case

ROOT = Path(__file__).resolve().parents[2]
SIZE = "128"
TIMEOUT_S = 30  # per evaluation (--timeout)
REJECTED = ("wrong result", "crash", "timeout")
_CLI = ("-c", "import sys; from peak_tune.cli import main; sys.exit(main())")


@dataclass(frozen=True)
class Outcome:
    """What the CLI reported for a kernel's seed trial."""

    outcome: str  # "ok", "wrong result", "crash", "timeout", "compile error", ... or why none
    gflops: float = 0.0
    vendor_gflops: float = 0.0

    @property
    def rejected(self) -> bool:
        return self.outcome in REJECTED

    def describe(self) -> str:
        if self.outcome == "ok":
            return f"ACCEPTED at {self.gflops:.2f} GFLOP/s (vendor {self.vendor_gflops:.2f})"
        return self.outcome


def build_catalog(folder: Path, cases: Iterable[Case], mark_dir: Path) -> Path:
    """A catalog with one seed per case: the built-in matmul spec, renamed, C only."""
    spec = (ROOT / "seeds" / "matmul" / "spec.toml").read_text()
    spec = re.sub(r"(?m)^(?:cuda|hip|hlsl)\s*=.*\n", "", spec)
    for case in cases:
        seed = folder / "seeds" / case.kernel
        seed.mkdir(parents=True, exist_ok=True)
        named = re.sub(r'(?m)^name\s*=\s*"matmul"', f'name = "{case.kernel}"', spec, count=1)
        (seed / "spec.toml").write_text(named)
        source = case.path.read_text().replace(MARK_DIR, str(mark_dir))
        (seed / "naive.c").write_text(source)
    return folder


def _cli(args: list[str], cwd: Path, limit_s: float) -> dict[str, Any]:
    """Run the CLI (stdout to a file: a kernel's leftover process may hold a pipe open);
    its last line of stdout as JSON."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, *_CLI, *args], cwd=cwd, stdout=stdout,
                                stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"peak-tune {' '.join(args[:2])} ran past {limit_s} s") from None
    lines = out.read_text().strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        tail = err.read_text()[-2000:]
        raise AssertionError(f"peak-tune exited with {proc.returncode}: {tail}")
    return dict(json.loads(lines[-1]))


def _outcome(summary: dict[str, Any]) -> Outcome:
    if summary.get("state", "done") not in ("done",):
        return Outcome(f"study {summary.get('state')}: {summary.get('reason', '')}")
    counts = {k: v for k, v in summary["trials"]["by_outcome"].items() if v}
    if len(counts) != 1:
        return Outcome(f"no single outcome: {counts or 'no trial'}")
    (name,) = counts
    vendor = float((summary.get("vendor") or {}).get("gflops") or 0.0)
    return Outcome(name, float(summary["best"]["gflops"] or 0.0), vendor)


def run_batch(cases: list[Case], catalog: Path, work: Path) -> dict[str, Outcome]:
    """One `peak-tune batch` with a study per case; case name -> outcome."""
    work.mkdir(parents=True, exist_ok=True)
    kernels = ", ".join(f'"{c.kernel}"' for c in cases)
    (work / "batch.toml").write_text(
        f'name = "adv"\ntrials = 1\ntimeout = {TIMEOUT_S}\ncatalogs = ["{catalog}"]\n'
        f'results = "{work / "results"}"\n[matrix]\nkernels = [{kernels}]\n'
        f'devices = ["cpu"]\ndtypes = ["float32"]\nsizes = ["{SIZE}"]\n')
    summary = _cli(["batch", str(work / "batch.toml"), "--json"], work,
                   limit_s=60 + 3 * TIMEOUT_S + 10 * len(cases))
    found = {s["kernel"]: _outcome(s) for s in summary["studies"]}
    return {c.name: found.get(c.kernel, Outcome("missing from the batch")) for c in cases}


def run_alone(case: Case, catalog: Path, work: Path) -> Outcome:
    """`peak-tune tune` of the case's seed alone (one trial)."""
    work.mkdir(parents=True, exist_ok=True)
    summary = _cli(["tune", "--catalog", str(catalog), "--kernel", case.kernel, "--trials", "1",
                    "--size", SIZE, "--timeout", str(TIMEOUT_S), "--results",
                    str(work / "results"), "--json"], work, limit_s=60 + 3 * TIMEOUT_S)
    return _outcome(summary)
