"""HLSL through Vulkan on an NVIDIA GPU: the search against cuBLAS and the documented peak,
with the PEAK paper's HLSL sequence (Refactor, TB-Tiling, Thread-Tiling) as the
comparison row, all in one run.

Per (dtype, size): a search study of the HLSL backend (`--backend hlsl --device h200`:
the shaders dispatched through NVIDIA's Vulkan driver, cuBLAS timed by the CUDA backend's
worker on the same GPU), then the paper's sequence as a fixed-sequence study (only its
parameters tuned). Each study's best is re-timed beside cuBLAS at its end; the ratios
are the summaries' (`ratio`: over cuBLAS; `peak_ratio`: over the profile's peak).

    python benchmarks/hlsl_matmul.py --configs float32:4096,float16:4096 --seconds 120

Needs the Vulkan loader and NVIDIA's ICD (../shared/PERF.md), glslang, CuPy and Optuna.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_matmul import _driver, study_row  # noqa: E402
from provenance import provenance  # benchmarks/ is the script's folder

PAPER_HLSL = ("refactor", "tb-tiling", "thread-tiling")  # the paper's Adreno sequence


def _brief(data: dict[str, Any]) -> dict[str, Any]:
    """What a row reports of a study's summary."""
    return {"ratio": data["ratio"], "ratio_to": data["ratio_to"],
            "peak_ratio": data["peak"]["ratio"], "best_gflops": data["best"]["gflops"],
            "vendor_gflops": data["vendor"]["gflops"], "vendor": data["vendor"]["name"],
            "sequence": data["best"]["sequence"], "params": data["best"]["params"],
            "confirmation": data["confirmation"]["status"], "trials": data["trials"],
            "trials_this_run": data["trials_this_run"], "seconds": data["seconds"],
            "failures": data["failures"], "cache": data["cache"], "time": data["time"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--configs", default="float32:2048,float32:4096,float16:2048,"
                        "float16:4096,float32:8192,float16:8192")
    parser.add_argument("--trials", type=int, default=400, help="trials per search at most")
    parser.add_argument("--seconds", type=float, default=120, help="time box per search")
    parser.add_argument("--paper-trials", type=int, default=60)
    parser.add_argument("--no-paper", action="store_true", help="the search rows alone")
    parser.add_argument("--no-search", action="store_true", help="the fixed rows alone")
    parser.add_argument("--warm-start", default="",
                        help="STUDY[,STUDY]: the search starts from their best trials (a CUDA "
                             "study's too: see --warm-start in the README)")
    parser.add_argument("--sequence", default="",
                        help="a fixed sequence ID,ID,... as a row of its own (only its "
                             "parameters tuned, --paper-trials of them)")
    parser.add_argument("--results", default="results-hlsl")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "hlsl_matmul.json"))
    args = parser.parse_args()
    record: dict[str, Any] = {"benchmark": "hlsl_matmul", **provenance(), "device": _driver(),
                              "rows": []}
    for config in args.configs.split(","):
        dtype, n = config.split(":")
        row: dict[str, Any] = {"dtype": dtype, "n": int(n)}
        if not args.no_search:
            row["search"] = _brief(study_row(dtype, int(n), args.trials, Path(args.results),
                                             args.seconds, backend="hlsl", device=args.device,
                                             confirm=True, warm_start=tuple(filter(
                                                 None, args.warm_start.split(",")))))
        fixed = {"paper": () if args.no_paper else PAPER_HLSL,
                 "sequence": tuple(filter(None, args.sequence.split(",")))}
        for name, sequence in fixed.items():
            if sequence:
                row[name] = _brief(study_row(
                    dtype, int(n), args.paper_trials, Path(args.results), args.seconds / 2,
                    sequence, backend="hlsl", device=args.device, confirm=True))
        record["rows"].append(row)
        Path(args.out).write_text(json.dumps(record, indent=1))
        for name in ("search", "paper", "sequence"):
            if name in row:
                s = row[name]
                print(f"{dtype:<8} {n:>5} {name} {s['ratio'] or 0:.3f}x {s['vendor']} "
                      f"({(s['peak_ratio'] or 0) * 100:.1f}% of peak, "
                      f"{s['best_gflops']:.0f} GFLOP/s, {s['trials']['total']} trials) | "
                      f"{' > '.join(s['sequence'])} {s['params']}", flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
