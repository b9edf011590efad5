"""Print the failed trials of the studies in a results folder: outcome, message, sequence
and parameters, one per line, most common message first. For a device call's log.

    python3 benchmarks/study_failures.py RESULTS_DIR [--status "wrong result"]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import optuna


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--status", default="wrong_result")
    args = parser.parse_args()
    storage = f"sqlite:///{args.results / 'peak.db'}"
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        failed = [t for t in study.trials if t.user_attrs.get("status") == args.status]
        counts = collections.Counter(str(t.user_attrs.get("message", ""))[:90] for t in failed)
        print(f"{summary.study_name}: {len(failed)} {args.status}")
        for message, count in counts.most_common(8):
            print(f"  {count:4d}  {message}")
        for trial in failed[:6]:
            print("   ", " > ".join(trial.user_attrs.get("sequence", [])),
                  trial.user_attrs.get("params", {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
