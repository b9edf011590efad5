"""Search quality on a replayed recording: which sampler and encoding find the best sooner.

Every run replays the same recorded outcomes, so differences come from the search alone.
Reports, per sampler x encoding over several seeds, the mean fraction of the recorded
best reached after 10/20/40 trials and the median number of trials to reach 95% of it.

    python benchmarks/search_quality.py --seeds 8 --trials 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import open_session

DEFAULT_RECORDING = Path(__file__).parents[1] / "tests/fixtures/replay/matmul-c-small.json"


def best_curve(recording: Path, sampler: str, encoding: str, polish: float, seed: int,
               trials: int, folder: Path) -> list[float]:
    data = json.loads(recording.read_text())
    size = int(data["outcomes"][0]["size"].split("x")[0])
    config = TuneConfig.of(sizes=({"M": size, "N": size, "K": size},), results=folder,
                           only=tuple(data["transformations"]), replay=recording,
                           sampler=sampler, encoding=encoding, seed=seed, polish=polish)
    session = open_session(config)
    curve: list[float] = []
    session.run(trials, lambda record: curve.append(max(
        [record.gflops, *curve[-1:]])))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", default=str(DEFAULT_RECORDING))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--samplers", default="tpe,random,cmaes")
    parser.add_argument("--polish", default="0,0.5",
                        help="shares of trials on neighbours of the best to compare")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "search_quality.json"))
    args = parser.parse_args()
    recording = Path(args.recording)
    data = json.loads(recording.read_text())
    optimum = max(o["flops"] / statistics.median(o["samples_ms"]) / 1e6
                  for o in data["outcomes"] if o["status"] == "ok")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peak-quality-") as tmp:
        for sampler, encoding, polish in itertools.product(
                args.samplers.split(","), ("subset", "steps"),
                [float(p) for p in args.polish.split(",")]):
            curves = [best_curve(recording, sampler, encoding, polish, seed, args.trials,
                                 Path(tmp) / f"{sampler}-{encoding}-{polish}-{seed}")
                      for seed in range(args.seeds)]
            to95 = [next((i + 1 for i, v in enumerate(c) if v >= 0.95 * optimum),
                         args.trials + 1) for c in curves]
            rows.append({
                "sampler": sampler, "encoding": encoding, "polish": polish,
                "best_fraction": {n: statistics.mean(c[min(n, len(c)) - 1] / optimum
                                                     for c in curves)
                                  for n in (10, 20, args.trials)},
                "median_trials_to_95pct": statistics.median(to95),
            })
    Path(args.out).write_text(json.dumps({
        "benchmark": "search_quality", "date": time.strftime("%Y-%m-%d"),
        "recording": recording.name, "space_points": len(data["outcomes"]),
        "recorded_best_gflops": optimum, "seeds": args.seeds, "trials": args.trials,
        "command": f"python benchmarks/search_quality.py --seeds {args.seeds} "
                   f"--trials {args.trials} --samplers {args.samplers} "
                   f"--polish {args.polish}",
        "rows": rows}, indent=1))
    print(f"wrote {args.out}\n{'sampler':<8} {'encoding':<8} {'polish':>6} {'@10':>6} "
          f"{'@20':>6} "
          f"{'@' + str(args.trials):>6} {'to 95%':>7}")
    for r in rows:
        f = r["best_fraction"]
        print(f"{r['sampler']:<8} {r['encoding']:<8} {r['polish']:>6} {f[10]:>6.3f} "
              f"{f[20]:>6.3f} "
              f"{f[args.trials]:>6.3f} {r['median_trials_to_95pct']:>7}")


if __name__ == "__main__":
    main()
