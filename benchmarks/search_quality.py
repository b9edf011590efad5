"""Search quality on a replayed recording: which search strategy finds the best sooner.

Every run replays the same recorded outcomes, so differences come from the search alone
(a partial recording, `record_landscape.py`'s, answers a point it lacks with its nearest
recorded one; the fidelity of that surrogate is reported beside the results). Per
strategy, over several seeds: the median number of trials to reach 90%, 95% and 99% of
the best recorded speed (a run that never does counts as `--trials` + 1), the mean
fraction of it reached after 10, 50 and `--trials` trials, and the driver's seconds per
trial (the replay answers at once, so that is the cost of asking and telling).

    python benchmarks/search_quality.py --seeds 10 --trials 40
    python benchmarks/search_quality.py --seeds 10 --trials 600 \
        --recording benchmarks/results/landscapes/landscape-float16-4096.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends.replay import replay_key, surrogate_fidelity
from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import open_session

DEFAULT_RECORDING = Path(__file__).parents[1] / "tests/fixtures/replay/matmul-c-small.json"
LEVELS = (0.90, 0.95, 0.99)

# what each compared strategy sets (the rest at peak-tune's defaults: `default` is what a
# user gets, TPE with the branch start and polishing)
STRATEGIES: dict[str, dict[str, Any]] = {
    "random": {"sampler": "random", "polish": 0.0, "branch_start": False},
    "random+polish": {"sampler": "random"},
    "tpe": {"sampler": "tpe", "polish": 0.0, "branch_start": False},
    "default": {},
    "tpe-ordinal": {"sampler": "tpe-ordinal", "polish": 0.0, "branch_start": False},
    "default-ordinal": {"sampler": "tpe-ordinal"},  # the default with ordered values
    "cmaes": {"sampler": "cmaes", "polish": 0.0, "branch_start": False},
    "gp": {"sampler": "gp", "polish": 0.0, "branch_start": False},  # needs PyTorch
}


def merged(recordings: list[Path]) -> dict[str, Any]:
    """Several recordings of one kernel, dtype and size as one: every distinct point (the
    first recording's where two hold it), the first one's vendor timing."""
    data = json.loads(recordings[0].read_text())
    seen = {replay_key(o["sequence"], o["params"], o["size"]) for o in data["outcomes"]}
    for other in recordings[1:]:
        more = json.loads(other.read_text())
        if (more.get("dtype"), more.get("backend")) != (data.get("dtype"), data.get("backend")):
            raise SystemExit(f"{other} records another dtype or backend than {recordings[0]}")
        for outcome in more["outcomes"]:
            key = replay_key(outcome["sequence"], outcome["params"], outcome["size"])
            if key not in seen:
                seen.add(key)
                data["outcomes"].append(outcome)
        data["partial"] = data.get("partial") or more.get("partial")
        data["transformations"] = sorted({*data["transformations"],
                                          *more["transformations"]})
    return data


def _recorded(recording: Path) -> tuple[dict[str, Any], dict[str, int], float]:
    data = json.loads(recording.read_text())
    first = data["outcomes"][0]["size"]
    dims = [int(v) for v in first.split("x")]
    size = dict(zip("MNK", dims, strict=False))
    optimum = max(o["flops"] / statistics.median(o["samples_ms"]) / 1e6
                  for o in data["outcomes"] if o["status"] == "ok")
    return data, size, optimum


def best_curve(job: tuple[str, str, int, int, str, str]) -> dict[str, Any]:
    """One replayed search: its best-so-far GFLOP/s after each trial, and its seconds."""
    recording, strategy, seed, trials, device, folder = job
    data, size, _ = _recorded(Path(recording))
    config = TuneConfig.of(sizes=(size,), results=Path(folder), device=device,
                           dtype=data.get("dtype", "float32"),
                           only=tuple(data["transformations"]), replay=Path(recording),
                           seed=seed, **STRATEGIES[strategy])
    started = time.perf_counter()
    session = open_session(config)
    curve: list[float] = []
    try:
        session.run(trials, lambda record: curve.append(max([record.gflops, *curve[-1:]])))
    finally:
        session.close()
    return {"strategy": strategy, "seed": seed, "curve": curve,
            "seconds": time.perf_counter() - started}


def _trials_to(curve: list[float], target: float, trials: int) -> int:
    return next((i + 1 for i, v in enumerate(curve) if v >= target), trials + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", default=str(DEFAULT_RECORDING),
                        help="FILE[,FILE...]: several recordings of one configuration "
                             "are replayed as one")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--strategies", default="random,random+polish,tpe,default,cmaes")
    parser.add_argument("--device", help="the recording's device profile (default: h200 "
                                         "for a GPU recording, else cpu)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "search_quality.json"))
    args = parser.parse_args()
    tmp_folder = tempfile.TemporaryDirectory(prefix="peak-quality-")
    tmp = tmp_folder.name
    recording = Path(tmp) / "recording.json"
    recording.write_text(json.dumps(merged([Path(p) for p in args.recording.split(",")])))
    data, _, optimum = _recorded(recording)
    device = args.device or ("cpu" if data.get("backend", "c") == "c" else "h200")
    strategies = args.strategies.split(",")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(str(recording), s, seed, args.trials, device, f"{tmp}/{s}-{seed}")
            for s in strategies for seed in seeds]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(best_curve, jobs)
    rows: list[dict[str, Any]] = []
    for strategy in strategies:
        mine = [r for r in runs if r["strategy"] == strategy]
        curves = [r["curve"] for r in mine]
        rows.append({
            "strategy": strategy, "settings": STRATEGIES[strategy],
            "median_trials_to": {f"{level:.0%}": statistics.median(
                _trials_to(c, level * optimum, args.trials) for c in curves)
                for level in LEVELS},
            "trials_to_95pct_per_seed": [_trials_to(c, 0.95 * optimum, args.trials)
                                         for c in curves],
            "best_fraction": {n: statistics.mean(c[min(n, len(c)) - 1] / optimum
                                                 for c in curves)
                              for n in (10, 50, args.trials)},
            "seconds_per_trial": statistics.median(r["seconds"] / max(len(r["curve"]), 1)
                                                   for r in mine),
        })
    result = {
        "benchmark": "search_quality", **provenance(),
        "recording": args.recording, "recorded_on": data.get("device"),
        "space_points": len(data["outcomes"]), "recorded_best_gflops": optimum,
        "seeds": list(seeds), "trials": args.trials,
        "rows": rows}
    if data.get("partial"):
        result["surrogate_fidelity"] = surrogate_fidelity(data["outcomes"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    tmp_folder.cleanup()
    print(f"wrote {args.out}")
    print(f"{'strategy':<14} " + " ".join(f"{'to ' + f'{v:.0%}':>7}" for v in LEVELS)
          + f" {'@10':>6} {'@50':>6} {'@' + str(args.trials):>6} {'s/trial':>8}")
    for r in rows:
        f, to = r["best_fraction"], r["median_trials_to"]
        print(f"{r['strategy']:<14} " + " ".join(f"{to[f'{v:.0%}']:>7g}" for v in LEVELS)
              + f" {f[10]:>6.3f} {f[50]:>6.3f} {f[args.trials]:>6.3f}"
              f" {r['seconds_per_trial']:>8.3f}")
    if "surrogate_fidelity" in result:
        print(f"surrogate (nearest recorded point) fidelity: {result['surrogate_fidelity']}")


if __name__ == "__main__":
    main()
