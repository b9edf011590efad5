"""Scaling of one study: trials per minute with 1..N device workers (the Ray executor),
and LLM applications per second with 1 vs 8 at once against a local OpenAI-protocol
server that answers after a fixed delay.

    python benchmarks/scaling.py --backend cuda --device h200 --size 4096 --workers 1,2
    python benchmarks/scaling.py --backend cuda --device h200 --workers 1,2,4 \
        --configs float32:4096,float16:4096,float32:8192,float16:8192
    python benchmarks/scaling.py --backend cuda --device h200 --workers 1,2 --batch \
        --configs float32:4096,float16:4096 --skip-llm
    python benchmarks/scaling.py --backend c --size 256 --workers 1,2 --trials 40

`--configs` (dtype:size, comma-separated) measures every worker count at each in turn,
in one call, instead of `--dtype` and `--size`; each row's speedup is against the first
worker count of its own configuration. `--batch` then runs the configurations as one
batch of studies at once (`peak-tune batch --parallel`'s code) on each worker count's
devices, shared among them: total trials per minute, and each study's device shares.
Each worker count tunes from an empty results folder with the same seed, so no run is
helped by another's cache. The LLM part runs the LLM applier and its client (its
applications, on a pool as the trial loop's), the server echoing the kernel after
`--llm-delay` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peak_tune.backends.base import EvalConfig  # noqa: E402
from peak_tune.errors import ApplyError, InvalidPoint  # noqa: E402
from peak_tune.session.config import TuneConfig  # noqa: E402
from peak_tune.session.tune import open_session  # noqa: E402
from tests.llm_server import Behaviour, LLMServer  # noqa: E402

_FENCED = re.compile(r"```[a-z+]*\n(.*?)```", re.S)


class _BoxOver(Exception):
    """The time box of one worker count is over."""


def _box_over(signum: int, frame: Any) -> None:
    raise _BoxOver


def device_scaling(args: argparse.Namespace, workers: int, dtype: str,
                   size: int) -> dict[str, Any]:
    """Trials per minute of a fresh search with `workers` device workers on Ray: the
    trials finished within `--seconds`."""
    with tempfile.TemporaryDirectory(prefix="peak-scaling-") as results:
        config = TuneConfig.of(
            backend=args.backend, device=args.device, dtype=dtype,
            sizes=({"M": size, "N": size, "K": size},),
            results=Path(results), executor="ray", ray_workers=workers, seed=args.seed,
            eval_config=EvalConfig(repeats=args.repeats),
        )
        session = open_session(config)
        try:
            session.measure_vendor()
            records: list[Any] = []
            started = time.perf_counter()
            deadline = started + args.seconds  # a device call must not run out unseen

            def finished(record: Any) -> None:
                if time.perf_counter() > deadline:
                    raise _BoxOver  # what is still in flight is not waited for
                records.append(record)

            # the box also ends while no trial finishes (slow kernels at large sizes): an
            # alarm interrupts the wait, and the trials in flight are failed as stopped
            signal.signal(signal.SIGALRM, _box_over)
            signal.setitimer(signal.ITIMER_REAL, args.seconds + 1.0)
            try:
                session.run(args.trials, finished, lambda: time.perf_counter() > deadline)
            except _BoxOver:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            seconds = min(time.perf_counter(), deadline) - started
            evaluations = dict(getattr(session.executor, "evaluations", {}))
            times = session.time_report()
        finally:
            session.close()
    return {"dtype": dtype, "size": size, "workers": workers, "trials": len(records),
            "seconds": round(seconds, 2),
            "trials_per_minute": round(60 * len(records) / seconds, 1),
            "best_gflops": round(max((r.gflops for r in records), default=0.0), 2),
            "evaluations_per_worker": evaluations,
            # builds timed on a device (trials also count cache hits and pruned points)
            "evaluations_per_minute": round(60 * sum(evaluations.values()) / seconds, 1),
            # a device busy far less than the whole run was waiting for the driver
            **times}


def batch_scaling(args: argparse.Namespace, workers: int,
                  configs: list[tuple[str, int]]) -> dict[str, Any]:
    """Trials per minute of a batch: one fresh study per configuration, run by
    `peak-tune batch`'s own code with `--parallel` = the studies, sharing `workers`
    devices of the kind (each takes its share, batch.devices) within `--seconds`."""
    from peak_tune.batch.devices import share_devices
    from peak_tune.batch.files import BatchPlan, BatchStudy
    from peak_tune.batch.run import BatchRun
    from peak_tune.executors.ray import RaySettings, import_ray, init_ray

    ray = import_ray()
    with tempfile.TemporaryDirectory(prefix="peak-batch-scaling-") as results:
        studies = tuple(BatchStudy(f"scaling-{dtype}-{size}", TuneConfig.of(
            backend=args.backend, device=args.device, dtype=dtype,
            sizes=({"M": size, "N": size, "K": size},), results=Path(results),
            study=f"scaling-{dtype}-{size}", executor="ray", seed=args.seed,
            eval_config=EvalConfig(repeats=args.repeats)), args.trials)
            for dtype, size in configs)
        plan = BatchPlan(Path("scaling"), studies, None, Path(results))
        init_ray(ray, RaySettings())  # one Ray for every study, up until the batch ends
        try:
            plan, devices = share_devices(plan, len(studies), lambda study: workers)
            started = time.perf_counter()
            deadline = started + args.seconds
            batch = BatchRun(plan, parallel=len(studies), devices=devices,
                             should_stop=lambda: time.perf_counter() > deadline)
            batch.run()
            seconds = time.perf_counter() - started
        finally:
            ray.shutdown()
    rows = [{"study": item.study.name, "state": item.state, "reason": item.reason,
             "ray_workers": item.study.config.run.ray_workers, "trials": item.new,
             "trials_per_minute": round(60 * item.new / seconds, 1),
             "best_gflops": round(item.best_gflops, 2), **item.device_time}
            for item in batch.items]
    busy = [share for row in rows for share in row.get("device_busy_fraction", {}).values()]
    return {"batch": [f"{d}:{n}" for d, n in configs], "workers": workers,
            "seconds": round(seconds, 2), "trials": sum(r["trials"] for r in rows),
            "trials_per_minute": round(60 * sum(r["trials"] for r in rows) / seconds, 1),
            # each study's workers' busy shares of its own run (a device is one study's)
            "device_busy_fraction": busy, "studies": rows}


def echo_after(delay_s: float) -> Any:
    """A model that takes `delay_s` and answers with the kernel it was shown."""
    def respond(body: dict[str, Any]) -> Behaviour:
        shown = _FENCED.findall(body["messages"][-1]["content"])
        return Behaviour(content=f"```c\n{shown[0] if shown else ''}```", delay_s=delay_s)
    return respond


def llm_scaling(args: argparse.Namespace, at_once: int) -> dict[str, Any]:
    """LLM applications per second with `at_once` in flight: distinct applications (one
    transformation, sample indices 0..n-1) through the session's pipeline and applier,
    the way the trial loop's apply pool runs them."""
    with tempfile.TemporaryDirectory(prefix="peak-llm-") as results, \
            LLMServer(responder=echo_after(args.llm_delay)) as server:
        os.environ.setdefault("OPENAI_API_KEY", "sk-scaling-benchmark")
        config = TuneConfig.of(
            sizes=({"M": 64, "N": 64, "K": 64},), results=Path(results), applier="llm",
            model="test-model", apply_workers=at_once, executor="local",
            llm_settings={"base_url": server.url + "/v1", "concurrency": at_once,
                          "repairs": 0, "max_retries": 0},
        )
        session = open_session(config)
        try:
            step = session.transformations[args.llm_transformation]
            seed = session.pipeline.seed

            def apply(sample: int) -> None:
                try:
                    session.pipeline.apply_one(seed, step, sample)
                except (ApplyError, InvalidPoint):
                    pass  # the echoed kernel may not be a valid application: still a call

            started = time.perf_counter()
            with ThreadPoolExecutor(at_once) as pool:
                list(pool.map(apply, range(args.llm_calls)))
            seconds = time.perf_counter() - started
        finally:
            session.close()
        calls = len(server.chat_requests())
    return {"at_once": at_once, "calls": calls, "seconds": round(seconds, 2),
            "calls_per_second": round(calls / seconds, 2),
            "max_in_flight_seen_by_server": server.max_in_flight}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="c")
    parser.add_argument("--device")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", default="1,2", help="device worker counts to compare")
    parser.add_argument("--configs", default="",
                        help="dtype:size pairs, comma-separated (instead of --dtype, --size)")
    parser.add_argument("--seconds", type=float, default=120,
                        help="time box per worker count (trials/min counts what finished)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llm-delay", type=float, default=0.5)
    parser.add_argument("--llm-calls", type=int, default=32)
    parser.add_argument("--llm-transformation", default="loop-interchange")
    parser.add_argument("--llm-at-once", default="1,8")
    parser.add_argument("--batch", action="store_true",
                        help="also run the configurations as one batch of studies at once "
                             "sharing each worker count's devices")
    parser.add_argument("--skip-llm", action="store_true")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    llm: list[dict[str, Any]] = []
    for dtype, size in configurations(args):
        first: dict[str, Any] | None = None
        for workers in args.workers.split(","):
            row = device_scaling(args, int(workers), dtype, size)
            rows.append(row)
            first = first or row
            base = first["trials_per_minute"]
            row["speedup"] = round(row["trials_per_minute"] / base, 2) if base else 0.0
            print(f"{dtype} {size}, devices {row['workers']}: {row['trials_per_minute']:7.1f} "
                  f"trials/min ({row['speedup']:.2f}x)  best {row['best_gflops']} GFLOP/s  "
                  f"per worker {row['evaluations_per_worker']}  "
                  f"busy {row['device_busy_fraction']}\n"
                  f"  job medians {row['job_median_s']}  driver loop {row['driver_loop_s']}")
            _write(args, rows, llm)  # what is done survives a call that runs out of time
    batches: list[dict[str, Any]] = []
    for workers in args.workers.split(",") if args.batch else ():
        row = batch_scaling(args, int(workers), configurations(args))
        batches.append(row)
        row["speedup"] = round(row["trials_per_minute"] / batches[0]["trials_per_minute"], 2) \
            if batches[0]["trials_per_minute"] else 0.0
        print(f"batch of {len(row['studies'])}, devices {workers}: "
              f"{row['trials_per_minute']:7.1f} trials/min ({row['speedup']:.2f}x)  "
              f"busy {row['device_busy_fraction']}")
        for study in row["studies"]:
            print(f"  {study['study']}: {study['state']} on {study['ray_workers'] or 'all'} "
                  f"device(s), {study['trials_per_minute']} trials/min "
                  f"{study['reason']}".rstrip())
        _write(args, rows, llm, batches)
    if not args.skip_llm:
        llm = [llm_scaling(args, int(n)) for n in args.llm_at_once.split(",")]
    for row in llm:
        row["speedup"] = round(row["calls_per_second"] / llm[0]["calls_per_second"], 2)
        print(f"LLM {row['at_once']} at once: {row['calls_per_second']:.2f} calls/s "
              f"({row['speedup']:.2f}x; server saw {row['max_in_flight_seen_by_server']} at "
              f"once)")
    _write(args, rows, llm, batches)
    return 0


def configurations(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(dtype, size) of each configuration measured: --configs, else --dtype and --size."""
    if not args.configs:
        return [(args.dtype, args.size)]
    found = []
    for item in args.configs.split(","):
        dtype, _, size = item.partition(":")
        if not dtype or not size.isdigit():
            raise SystemExit(f"--configs: {item!r} is not dtype:size (e.g. float16:4096)")
        found.append((dtype, int(size)))
    return found


def _write(args: argparse.Namespace, rows: list[dict[str, Any]],
           llm: list[dict[str, Any]], batches: list[dict[str, Any]] | None = None) -> None:
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "devices": rows, "batches": batches or [],
                                        "llm": llm}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
