"""What the driver side of a CUDA study sustains, on a machine without a GPU.

Times the parts of a trial that happen before the device: Optuna's TPE asking for a
sequence and values over the CUDA catalog (in memory, as the driver does), the reference
applier, and NVRTC building the variant on `--build-workers` threads. If these
together sustain more points per second than the GPU worker evaluates (16 per second
measured at 4096 fp32 on the H200), the device is the limit, not the driver.

    python benchmarks/driver_throughput.py --points 200 --build-workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from peak_tune.appliers.reference import ReferenceApplier  # noqa: E402
from peak_tune.backends.base import EvalConfig  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.cache import Cache  # noqa: E402
from peak_tune.catalog.resolve import Catalog  # noqa: E402
from peak_tune.errors import ApplyError, CompileError, InvalidPoint  # noqa: E402
from peak_tune.pipeline import Pipeline, PipelineSetup  # noqa: E402
from peak_tune.search.samplers import make_sampler  # noqa: E402
from peak_tune.search.space import SubsetEncoding, suggest_params  # noqa: E402


class _NoGpuCudaBackend(CudaBackend):
    """Compiles as the CUDA backend does; names no GPU (there is none to ask here)."""

    def fingerprint(self) -> dict[str, str]:
        return {"device": "none: compile pace only"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--build-workers", type=int, default=2)
    parser.add_argument("--device", default="h200")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    catalog = Catalog.with_user_folders()
    spec = catalog.spec("matmul")
    device = catalog.device(args.device)
    transformations = {t.id: t for t in catalog.transformations_for("matmul", "cuda")}
    with tempfile.TemporaryDirectory() as results:
        backend = _NoGpuCudaBackend(device)
        pipeline = Pipeline(PipelineSetup(spec, args.dtype, device, transformations,
                                          EvalConfig()),
                            backend, ReferenceApplier(), Cache(Path(results) / "cache"))
        encoding = SubsetEncoding(transformations, repair=True)
        study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", 0))
        ask_s = apply_s = 0.0
        builds = []
        started = time.perf_counter()
        with ThreadPoolExecutor(args.build_workers) as pool:
            for n in range(args.points):
                t0 = time.perf_counter()
                trial = study.ask()
                try:
                    sequence = encoding.suggest(trial)
                    t1 = time.perf_counter()
                    variant = pipeline.build(sequence)[-1]
                    apply_s += time.perf_counter() - t1
                    params = suggest_params(trial, variant)
                except (InvalidPoint, ApplyError):
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                ask_s += time.perf_counter() - t0
                builds.append(pool.submit(pipeline.compile, variant, params))
                study.tell(trial, float(n % 7))  # a stand-in value: only the pace matters
            built = 0
            for build in builds:
                try:
                    build.result()
                    built += 1
                except (CompileError, InvalidPoint):
                    pass
        seconds = time.perf_counter() - started
    result = {
        "points": args.points, "built": built, "build_workers": args.build_workers,
        "seconds": round(seconds, 2), "points_per_second": round(args.points / seconds, 2),
        "ask_and_suggest_ms_per_point": round(1e3 * (ask_s - apply_s) / args.points, 2),
        "apply_ms_per_point": round(1e3 * apply_s / args.points, 2),
        "compile_s_per_build": round(seconds * args.build_workers / max(built, 1), 3),
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
