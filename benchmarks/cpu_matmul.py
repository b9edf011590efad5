"""CPU benchmark: search on the C backend, best found vs numpy, at 512 and 1024.

Each size is its own study in a fresh results folder (nothing cached from earlier runs);
numpy's matmul is timed by the same harness in the same run, so the ratio is what
counts. Prints a short table last and writes the full JSON.

    python benchmarks/cpu_matmul.py --trials 200 --out benchmarks/results/cpu-....json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.session.config import TuneConfig
from peak_tune.session.progress import summary
from peak_tune.session.tune import open_session


def run_size(size: int, trials: int, seed: int, results: Path, sampler: str) -> dict[str, Any]:
    config = TuneConfig.of(sizes=({"M": size, "N": size, "K": size},), seed=seed,
                           sampler=sampler, results=results)
    started = time.perf_counter()
    session = open_session(config)
    try:
        session.measure_vendor()
        session.run(trials, lambda record: None)
    finally:
        session.close()
    data = summary(session, time.perf_counter() - started)
    trials_to_half = next(
        (t.number + 1 for t in sorted(session.study.trials, key=lambda t: t.number)
         if t.values and data["vendor"]["gflops"]
         and t.values[0] >= 0.5 * data["vendor"]["gflops"]), None)
    data["trials_to_half_of_vendor"] = trials_to_half
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sizes", default="512,1024")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--out", help="JSON file to write (default: $OUT/cpu_matmul.json)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="peak-bench-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(run_size(size, args.trials, args.seed, Path(tmp) / str(size),
                                 args.sampler))
    record = {
        "benchmark": "cpu_matmul",
        **provenance(),
        "device": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "runs": rows,
    }
    out = args.out or os.path.join(os.environ.get("OUT", "."), "cpu_matmul.json")
    Path(out).write_text(json.dumps(record, indent=1))
    print(f"\nwrote {out}")
    print(f"{'size':>14} {'best GFLOP/s':>13} {'numpy GFLOP/s':>14} {'ratio':>6} "
          f"{'trials':>6} {'to 0.5x':>7} {'time s':>7}  best sequence")
    for row in rows:
        print(f"{row['sizes'][0]:>14} {row['best']['gflops']:>13.1f} "
              f"{row['vendor']['gflops']:>14.1f} {row['ratio']:>6.3f} "
              f"{row['trials']['total']:>6} {row['trials_to_half_of_vendor'] or '-':>7} "
              f"{row['seconds']:>7.0f}  {' > '.join(row['best']['sequence'])}")


if __name__ == "__main__":
    main()
