"""What the LLM applier's step checks cost a step (issue 19: at most 10% of its wall time).

Each step of a good C sequence (the reference applier's child: a reply that passes every
check) is checked as the LLM applier checks a reply, side by side in one run: the step
checks (changed, parameters present and live: the preprocessor at two values of each),
the compile check and the result check (a fresh build each). The share is the step
checks' part of all three, as with a model that answers at once (the worst case); a real
model's reply takes seconds, and the share beside a 5 s reply is printed too.
Run on a quiet machine; each figure is min / median / max over --repeats.

    python3 benchmarks/llm_step_checks.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.appliers.llm import _check_step as step_checks  # noqa: E402
from peak_tune.appliers.llm import backend_compile_check, backend_result_check  # noqa: E402
from peak_tune.appliers.reference import ReferenceApplier  # noqa: E402
from peak_tune.backends.base import EvalConfig  # noqa: E402
from peak_tune.backends.c import CBackend  # noqa: E402
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations  # noqa: E402
from peak_tune.catalog.types import Transformation  # noqa: E402
from peak_tune.core import KernelContext  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402

SEQUENCE = ("loop-interchange", "cache-blocking", "pack-a", "pack-b", "register-blocking",
            "simd-vectorize", "unroll-k", "openmp-parallel", "prefetch")
MODEL_REPLY_S = 5.0  # a capable model's reply to one pass, for the second share


def spread(samples: list[float]) -> dict[str, float]:
    return {"min_ms": round(1e3 * min(samples), 2),
            "median_ms": round(1e3 * statistics.median(samples), 2),
            "max_ms": round(1e3 * max(samples), 2)}


def timed(action: Callable[[], Any], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    return samples


def measure_step(parent: KernelContext, step: Transformation, child: KernelContext,
                 compile_check: Callable[[KernelContext], str | None],
                 result_check: Callable[[KernelContext], str | None],
                 repeats: int) -> dict[str, Any]:
    """One step's checks of a reply that passes them all, side by side: the step checks
    (changed, parameters present and live), the compile check and the result check that
    the applier runs on the same reply (each a fresh build: its own build folder)."""
    checks = timed(lambda: step_checks(parent, child, step, True), repeats)
    compiles = timed(lambda: compile_check(child), repeats)
    results = timed(lambda: result_check(child), repeats)
    rest = statistics.median(compiles) + statistics.median(results)
    median = statistics.median(checks)
    return {"transformation": step.id, "passes": len(step.passes),
            "step_checks": spread(checks), "compile_check": spread(compiles),
            "result_check": spread(results),
            "checks_share_of_step": round(median / (median + rest), 4),
            "checks_share_with_a_5s_reply": round(
                median / (median + rest + MODEL_REPLY_S * len(step.passes)), 5)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    backend = CBackend(load_device(ROOT / "backends" / "devices" / "cpu.toml"))
    device = backend.probe()
    spec = load_spec(ROOT / "seeds" / "matmul")
    catalog = load_transformations([ROOT / "transforms"])
    reference = ReferenceApplier()
    rows = []
    parent = seed_context(spec, "c")
    with backend:
        for tid in SEQUENCE:
            child = reference.apply(parent, catalog[tid], device)
            builds = tempfile.mkdtemp(prefix="peak-tune-step-checks-")

            def fresh_compile(context: KernelContext, folder: str = builds) -> str | None:
                return backend_compile_check(backend, "float32",
                                             tempfile.mkdtemp(dir=folder))(context)

            def fresh_result(context: KernelContext, folder: str = builds) -> str | None:
                return backend_result_check(backend, spec, "float32",
                                            tempfile.mkdtemp(dir=folder), EvalConfig())(
                    context)

            rows.append(measure_step(parent, catalog[tid], child, fresh_compile,
                                     fresh_result, args.repeats))
            parent = child
    result = {"benchmark": "llm_step_checks", **provenance(),
              "device": device.title, "cpu": dict(backend.fingerprint()),
              "repeats": args.repeats, "steps": rows,
              "worst_share": max(r["checks_share_of_step"] for r in rows),
              "worst_share_with_a_5s_reply": max(r["checks_share_with_a_5s_reply"]
                                                 for r in rows)}
    out = Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm_step_checks.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        print(f"{r['transformation']:<18} step checks {r['step_checks']['median_ms']:6.1f} ms"
              f"  compile check {r['compile_check']['median_ms']:7.1f} ms  result check "
              f"{r['result_check']['median_ms']:7.1f} ms  share "
              f"{100 * r['checks_share_of_step']:.1f}%")
    print(f"worst share {100 * result['worst_share']:.1f}% of a step's checks (an instant "
          f"reply); {100 * result['worst_share_with_a_5s_reply']:.2f}% with a 5 s reply")
    return 0


if __name__ == "__main__":
    sys.exit(main())
