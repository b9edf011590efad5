"""What the driver of a CUDA study sustains when the device answers at once.

Runs the real trial loop (`TuneSession.run`: ask, sequence, reference applier, values,
executor, tell, study storage) over the CUDA catalog with a backend whose evaluation is
instant, so the figure is the ceiling the driver puts on a study, whatever its GPUs do.
Builds are skipped unless `--compile` (then NVRTC builds for the device's architecture
on the executor's threads, as in a real run). `--build-s` and `--device-s` turn it into
a model of a real study on one GPU: builds sleep about that long (spread 0.25x-4x per
variant), timings hold the one timer thread that long, and the figure is what the loop
and the local executor make of those times. Compares, in one run, Optuna's TPE as
configured before (`plain`: every trial, every group), the sampler peak-tune uses
(`focused`: peak_tune.search.focus) drawing in the driver, and the same drawing ahead in
a process of its own (`ahead`: peak_tune.search.ask_ahead, the default for GPU studies).
`ask_ms_by_trial` is the driver's own time to ask for a trial and choose its sequence.

    python benchmarks/driver_throughput.py --trials 400
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from peak_tune.search import samplers, study  # noqa: E402
from peak_tune.session import parts, tune  # noqa: E402
from peak_tune.session.config import TELL_ORDERS, TuneConfig  # noqa: E402
from tests.instant_backend import InstantCudaBackend  # noqa: E402


def plain_tpe(name: str, seed: int | None, roles: Any = None) -> optuna.samplers.BaseSampler:
    """TPE as peak-tune configured it before the focused sampler."""
    return samplers._tpe(seed).inner  # type: ignore[attr-defined]  # the unwrapped TPE


def one_run(args: argparse.Namespace, label: str,
            make_sampler: Callable[..., optuna.samplers.BaseSampler],
            ask_ahead: int) -> dict[str, Any]:
    study.make_sampler = make_sampler  # type: ignore[assignment]
    asks: list[float] = []
    with tempfile.TemporaryDirectory(prefix="peak-driver-") as results:
        config = TuneConfig.of(backend="cuda", device=args.device, dtype=args.dtype,
                               sizes=({"M": args.size, "N": args.size, "K": args.size},),
                               results=Path(results), executor="local", seed=0,
                               compile_workers=args.build_workers,
                               tell_order=args.tell_order, ask_ahead=ask_ahead)
        session = tune.open_session(config)
        ask, start = session._ask, session._start
        began = [0.0]

        def timed_ask() -> optuna.Trial:
            began[0] = time.perf_counter()
            return ask()

        def timed_start(item: Any) -> None:
            try:
                start(item)  # the sequence's suggestions: where the driver samples
            finally:
                asks.append(time.perf_counter() - began[0])

        session._ask = timed_ask  # type: ignore[method-assign]
        session._start = timed_start  # type: ignore[method-assign]
        records: list[Any] = []
        InstantCudaBackend.evaluations = 0
        try:
            started = time.perf_counter()
            session.run(args.trials, records.append)
            seconds = time.perf_counter() - started
        finally:
            session.close()
    buckets = {f"{i}-{i + 100}": round(1e3 * statistics.mean(asks[i:i + 100]), 1)
               for i in range(0, len(asks), 100)}
    row = {"sampler": label, "trials": len(records), "seconds": round(seconds, 2),
           "trials_per_second": round(len(records) / seconds, 2),
           "evaluations": InstantCudaBackend.evaluations,
           # the share of the run the (modelled) device spent timing
           "device_busy_fraction": round(InstantCudaBackend.evaluations * args.device_s
                                         / seconds, 2),
           "ask_ms_by_trial": buckets}
    print(json.dumps(row))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--device", default="h200")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--build-workers", type=int, default=16,
                        help="the executor's build threads (its window is twice this)")
    parser.add_argument("--compile", action="store_true", help="build with NVRTC for real")
    parser.add_argument("--build-s", type=float, default=0.0,
                        help="median seconds a build sleeps (the model of a real study)")
    parser.add_argument("--device-s", type=float, default=0.0,
                        help="seconds a timing sleeps on the one timer thread")
    parser.add_argument("--tell-order", default="auto", choices=TELL_ORDERS)
    parser.add_argument("--samplers", default="plain,focused,ahead")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    InstantCudaBackend.compile_for_real = args.compile
    InstantCudaBackend.build_s, InstantCudaBackend.device_s = args.build_s, args.device_s
    parts.make_backend = lambda name, device: InstantCudaBackend(device)  # type: ignore
    # the sampler process builds its own focused TPE: `plain` and `focused` sample in
    # the driver, `ahead` in the process
    choices = {"plain": (plain_tpe, 0), "focused": (samplers.make_sampler, 0),
               "ahead": (samplers.make_sampler, -1)}
    rows = [one_run(args, label, *choices[label]) for label in args.samplers.split(",")]
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
