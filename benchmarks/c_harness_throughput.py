"""Evaluations per second of the C backend's harness, for fixed, prebuilt variants.

A few variants of one good sequence (reference applier; tuning points cycled) are
compiled up front, then evaluated again and again through CBackend.evaluate at --size:
check sizes, validation and timed runs, as in a search; numpy is timed the same way.
Builds are left out, so what is measured is the harness: inputs, checks, isolation and
the runs themselves. For a before/after, run it from each tree's root in turn, on a quiet
machine (`--label`); it writes JSON to $OUT (or ./results) and prints one line.
`--builds` compiles each variant afresh before its evaluation, as a search does (the
harness then does the next evaluation's work that needs no kernel while gcc runs), and
times the evaluations alone.

    python3 benchmarks/c_harness_throughput.py --size 512 --evaluations 40 --label after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.appliers.reference import ReferenceApplier  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.c import CBackend  # noqa: E402
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations  # noqa: E402
from peak_tune.core import ProblemSize  # noqa: E402
from peak_tune.evaluation.pipeline import seed_context  # noqa: E402

SEQUENCE = ("openmp-parallel", "unroll-k", "register-blocking", "simd-vectorize",
            "tile-interchange")
POINTS = ({"OMP_CHUNK": 8, "UNROLL_K": 2, "MR": 4, "NR": 64},
          {"OMP_CHUNK": 4, "UNROLL_K": 2, "MR": 4, "NR": 32},
          {"OMP_CHUNK": 8, "UNROLL_K": 4, "MR": 8, "NR": 32},
          {"OMP_CHUNK": 16, "UNROLL_K": 1, "MR": 4, "NR": 64})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--evaluations", type=int, default=40)
    parser.add_argument("--label", default="after")
    parser.add_argument("--builds", action="store_true",
                        help="a fresh build before every evaluation (timed apart)")
    args = parser.parse_args()
    backend = CBackend(load_device(ROOT / "backends" / "devices" / "cpu.toml"))
    device = backend.probe()  # the host's facts (vector width, cores) filled in
    spec = load_spec(ROOT / "seeds" / "matmul")
    catalog = load_transformations([ROOT / "transforms"])
    applier = ReferenceApplier()
    context = seed_context(spec, "c")
    for tid in SEQUENCE:
        context = applier.apply(context, catalog[tid], device)
    size = ProblemSize.of({"M": args.size, "N": args.size, "K": args.size})
    config = EvalConfig(timeout_s=120.0)  # the search's defaults
    build = tempfile.mkdtemp(prefix="peak-tune-c-throughput-")
    result: dict[str, Any] = {**provenance(), "label": args.label, "size": size.as_dict(),
                              "sequence": list(SEQUENCE)}
    with backend:
        result["fingerprint"] = dict(backend.fingerprint())
        points = []
        for values in POINTS:
            params = {p.name: values[p.name] for p in context.params}
            artifact = backend.compile(context, params, "float32", build)
            points.append((artifact, EvalRequest(spec, context, params, "float32", size,
                                                 spec.check_sizes, config)))
        backend.evaluate(*points[0])  # worker start, first arenas
        gflops = []
        elapsed = built = 0.0
        for index in range(args.evaluations):
            artifact, request = points[index % len(points)]
            if args.builds:
                started = time.perf_counter()
                artifact = backend.compile(context, request.params, "float32",
                                           tempfile.mkdtemp(dir=build))
                built += time.perf_counter() - started
            started = time.perf_counter()
            gflops.append(backend.evaluate(artifact, request).gflops)
            elapsed += time.perf_counter() - started
        vendor = backend.time_vendor(spec, "float32", size, config)[1].gflops
    result.update(evaluations=args.evaluations, seconds=elapsed, build_seconds=built,
                  evaluations_per_s=args.evaluations / elapsed,
                  kernel_gflops_median=statistics.median(gflops), vendor_gflops=vendor,
                  load_average=os.getloadavg()[0])
    out = Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"c_harness_throughput-{args.label}.json").write_text(json.dumps(result, indent=1))
    print(f"{args.label}: n = {args.size}, {result['evaluations_per_s']:.2f} evaluations/s "
          f"over {args.evaluations} ({1e3 * elapsed / args.evaluations:.0f} ms each)"
          + (f"; with builds {1e3 * (elapsed + built) / args.evaluations:.0f} ms each"
             if args.builds else "") +
          f"; kernel {result['kernel_gflops_median']:.1f} GFLOP/s, numpy {vendor:.1f}; "
          f"load {result['load_average']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
