"""Record a GPU search landscape: every point a set of real studies evaluate, for replay.

The CUDA space is far too large to enumerate (`record_space.py` does that for small C
spaces); instead real searches run on the device, one study per sampler and seed, and
every trial they told (its sequence, tuning values, outcome and speed) goes into one
recording in the `--replay` format, with cuBLAS timed in the same run. Studies of
different samplers cover the space differently: random spreads over it, TPE digs into
its good regions, so the recording holds both the landscape's shape and its peaks.

    python benchmarks/record_landscape.py --configs float16:4096,float32:4096 \
        --samplers random:0,tpe:0 --seconds 120 --out-dir $OUT

writes one `landscape-<dtype>-<n>.json` per configuration, marked partial (replay it with
`benchmarks/search_quality.py --recording FILE[,FILE...]`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cuda_matmul import _driver, study_row  # type: ignore[import-not-found]  # noqa: E402
from provenance import commit  # benchmarks/ is the script's folder

from peak_tune.session.recording import study_outcomes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="float16:4096,float32:4096")
    parser.add_argument("--samplers", default="random:0,tpe:0",
                        help="SAMPLER:SEED,... one study each per configuration")
    parser.add_argument("--seconds", type=float, default=120, help="time box per study")
    parser.add_argument("--device", default="h200")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--sampler-processes", type=int, default=-1,
                        help="the studies' --sampler-processes (default: peak-tune's)")
    parser.add_argument("--tag", default="", help="added to the output file's name")
    parser.add_argument("--results", default="/tmp/landscape-results")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    for config in args.configs.split(","):
        dtype, n = config.split(":")
        studies, rows = [], []
        for entry in args.samplers.split(","):
            sampler, seed = entry.split(":")
            name = f"landscape-{dtype}-{n}-{sampler}-{seed}{args.tag}"
            row = study_row(dtype, int(n), 10**6, Path(args.results), args.seconds,
                            study=name, backend=args.backend, device=args.device,
                            sampler=sampler, seed=int(seed),
                            sampler_processes=args.sampler_processes)
            rows.append({"study": name, "sampler": sampler, "seed": int(seed),
                         "ratio": row["ratio"], "trials": row["trials"],
                         "trials_per_second": row["trials_per_second"],
                         "best": row["best"], "time": row["time"]})
            studies.append(name)
            print(f"{name}: {row['trials']['total']} trials, best/cuBLAS {row['ratio']}",
                  flush=True)
        outcomes, vendor_timing = study_outcomes(Path(args.results), studies)
        path = Path(args.out_dir) / f"landscape-{dtype}-{n}{args.tag}.json"
        path.write_text(json.dumps({
            "recorded": time.strftime("%Y-%m-%d"), "device": _driver(), "commit": commit(),
            "backend": args.backend or "cuda", "dtype": dtype,
            "command": "python benchmarks/record_landscape.py "
                       f"--configs {config} --samplers {args.samplers} "
                       f"--seconds {args.seconds:g}"
                       + (f" --sampler-processes {args.sampler_processes}"
                          if args.sampler_processes > 0 else ""),
            # points no study told are answered by their nearest recorded one on replay
            "partial": True, "transformations": sorted({s for o in outcomes
                                                        for s in o["sequence"]}),
            "studies": rows, "vendor": vendor_timing, "outcomes": outcomes,
        }, separators=(",", ":")))
        print(f"wrote {path}: {len(outcomes)} distinct points", flush=True)


if __name__ == "__main__":
    main()
