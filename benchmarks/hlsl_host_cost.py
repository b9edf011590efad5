"""The host's share of one timed HLSL run: drawing its inputs, poison and reference
projection (what every timed run did before the worker kept drawn problems, see
backends._hlsl_worker._Draws) against writing a problem drawn earlier (what it does
now). No GPU needed; the upload, dispatch, read-back and check are the same in both.

    python benchmarks/hlsl_host_cost.py --sizes 2048,4096 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402 (benchmarks/ is the script's folder)

from peak_tune.catalog.loaders import load_spec  # noqa: E402
from peak_tune.core import ProblemSize  # noqa: E402
from peak_tune.evaluation.projections import project_expected  # noqa: E402
from peak_tune.evaluation.validation import make_problem  # noqa: E402
from peak_tune.harness.values import secret_seed  # noqa: E402


def measure(n: int, rounds: int) -> dict[str, object]:
    spec = load_spec(ROOT / "seeds" / "matmul")
    base = make_problem(spec, ProblemSize.of({"M": n, "N": n, "K": n}), "float32",
                        secret_seed())
    drawing, writing = [], []
    for _ in range(rounds):
        began = time.perf_counter()
        problem = base.refill(secret_seed())
        project_expected(problem, secret_seed(), one_side=True)
        drawing.append(time.perf_counter() - began)
    drawn = [base.drawn(secret_seed()) for _ in range(2)]
    for index in range(rounds):
        began = time.perf_counter()
        drawn[index % 2].write()
        writing.append(time.perf_counter() - began)
    return {"n": n, "draw_and_project_s": [round(s, 4) for s in drawing],
            "write_drawn_s": [round(s, 4) for s in writing]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2048,4096")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "hlsl_host_cost.json"))
    args = parser.parse_args()
    rows = [measure(int(n), args.rounds) for n in args.sizes.split(",")]
    record = {"benchmark": "hlsl_host_cost", **provenance(),
              "device": f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
              "cores (host only)", "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
