"""Record every point of a small search space with the real backend, for replay.

The recording lets search strategies be compared (and the search logic be tested) in
seconds with `peak-tune --replay FILE`, exactly the same way every run.

    python benchmarks/record_space.py --transforms loop-interchange,unroll-k,\
openmp-parallel,restrict-align --size 96 -o tests/fixtures/replay/matmul-c-small.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from peak_tune.backends.base import EvalConfig
from peak_tune.session.config import TuneConfig
from peak_tune.session.recording import record_space
from peak_tune.session.tune import open_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transforms", required=True, help="ID,ID,... (keep it small)")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    ids = args.transforms.split(",")
    with tempfile.TemporaryDirectory(prefix="peak-record-") as tmp:
        config = TuneConfig.of(sizes=({"M": args.size, "N": args.size, "K": args.size},),
                               results=Path(tmp), only=tuple(ids),
                               eval_config=EvalConfig(repeats=args.repeats))
        session = open_session(config)
        try:
            count = record_space(session, ids, Path(args.output))
        finally:
            session.close()
    print(f"recorded {count} outcomes to {args.output}")


if __name__ == "__main__":
    main()
