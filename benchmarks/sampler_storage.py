"""How fast TPE asks when the study lives in memory vs in SQLite (why the driver samples
on an in-memory copy; see peak_tune/study/mirror.py).

    python benchmarks/sampler_storage.py --trials 320

A space shaped like the CUDA catalog's: 17 on/off transformations, each with a tuning
value; trials asked 16 at a time (constant liar), as the trial loop keeps them in flight.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peak_tune.search.samplers import make_sampler  # noqa: E402
from peak_tune.study.storage import open_storage  # noqa: E402


def objective_params(trial: optuna.Trial) -> float:
    total = 0
    for i in range(17):
        if trial.suggest_categorical(f"use.{i}", [False, True]):
            total += trial.suggest_int(f"p{i}", 1, 8, log=True)
    return float(total)


def trials_per_second(storage: optuna.storages.BaseStorage | None, trials: int) -> float:
    study = optuna.create_study(storage=storage, direction="maximize",
                                sampler=make_sampler("tpe", 0))
    started = time.perf_counter()
    for _ in range(trials // 16):
        asked = [study.ask() for _ in range(16)]
        for trial, value in [(t, objective_params(t)) for t in asked]:
            study.tell(trial, value)
    return trials / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=320)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        sqlite = trials_per_second(open_storage(f"sqlite:///{folder}/peak.db"), args.trials)
    memory = trials_per_second(None, args.trials)
    print(json.dumps({"trials": args.trials, "memory_trials_per_s": round(memory, 1),
                      "sqlite_trials_per_s": round(sqlite, 1),
                      "ratio": round(memory / sqlite, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
