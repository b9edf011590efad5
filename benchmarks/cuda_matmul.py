"""H200 benchmark: the search (no hand-picked sequence) against cuBLAS, with the paper's
sequences and an autotuned Triton matmul as comparison rows, all in one run.

Per (dtype, size): a search study, then each paper sequence as a fixed-sequence study
(only its parameters tuned); each study's best and cuBLAS are timed by the same harness
in the same worker. Triton and cuBLAS (torch) are timed side by side with
triton.testing.do_bench; only ratios within one timer are reported.

    python benchmarks/cuda_matmul.py --trials 300 --paper-trials 60 --results /tmp/r

A run starts fresh studies unless `--study NAME` is given: then the search study of each
(dtype, size) is `NAME-<dtype>-<n>` (a paper row's `NAME-<dtype>-<n>-<paper>`) in
--results, created or continued, so a later device call given the same folder back (its
`peak.db` and `cache/`; `cache/builds` may be left behind, builds are redone) goes on
where this one stopped. `trials_per_second` counts the trials of this run only.
`--warm-start`: each search after the first of its dtype starts from the best trials of
the one before it (4096 -> 8192), as a user tuning several sizes would.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

from optuna.trial import TrialState
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends.base import BUILD_BUDGET
from peak_tune.session.config import TuneConfig
from peak_tune.session.progress import summary
from peak_tune.session.tune import open_session

PAPER = Path(__file__).with_name("paper_sequences.toml")


def _driver() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def study_row(dtype: str, n: int, trials: int, results: Path, seconds: float,
              sequence: tuple[str, ...] = (), profile: bool = False,
              study: str | None = None, warm_start: tuple[str, ...] = (),
              ask_ahead: int = -1, build_budget: float = BUILD_BUDGET,
              backend: str | None = None, device: str = "h200", confirm: bool = False,
              sampler: str = "tpe", seed: int = 0, sampler_processes: int = -1,
              in_flight: int = 0) -> dict[str, Any]:
    config = TuneConfig.of(device=device, backend=backend, dtype=dtype,
                           sizes=({"M": n, "N": n, "K": n},),
                           results=results, sequence=sequence, seed=seed, study=study,
                           sampler=sampler, sampler_processes=sampler_processes,
                           warm_start=warm_start, ask_ahead=ask_ahead,
                           build_budget=build_budget, in_flight=in_flight)
    started = time.perf_counter()
    session = open_session(config)
    earlier = len(session.study.get_trials(  # a continued study's, run to an end
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))
    try:
        session.measure_vendor()
        deadline = started + seconds
        ran = time.perf_counter()
        session.run(trials, lambda record: None, lambda: time.perf_counter() > deadline)
        searching = time.perf_counter() - ran
        searched = time.perf_counter() - started
        ncu = _profile(session) if profile else None
        if confirm:  # the time box stopped the run before its own end-of-run re-timing
            session.confirm_best()
    finally:
        session.close()
    data = summary(session, searched)
    data["trials_this_run"] = data["trials"]["total"] - earlier
    # end to end (the worker's start, cuBLAS timed, the search), and in the search alone
    data["trials_per_second"] = data["trials_this_run"] / max(data["seconds"], 1e-9)
    data["search_seconds"] = round(searching, 1)
    data["trials_per_search_second"] = round(data["trials_this_run"] / searching, 2)
    data["over_build_budget"] = data["trials"]["over_build_budget"]
    # where the time went (TuneSession.time_report), and before the search began
    data["time"] = {**data["time"], "startup_s": round(ran - started, 1)}
    data["failures"] = failure_messages(session)
    if ncu is not None:
        data["ncu"] = ncu
    return data


def failure_messages(session: Any, top: int = 5) -> dict[str, int]:
    """The commonest first lines of the failed trials' messages (numbers as N), so that a
    run's compile errors or crashes can be read without its study database."""
    counts: collections.Counter[str] = collections.Counter()
    for trial in session.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        message = str(trial.user_attrs.get("message", "")).strip().splitlines()[:1]
        counts[re.sub(r"\d+", "N", message[0] if message else "")[:200]] += 1
    return dict(counts.most_common(top))


def _profile(session: Any) -> str:
    """ncu's key metrics of the best variant (the CSV lands in <results>/profiles)."""
    try:
        return str(session.profile_best())
    except Exception as exc:  # noqa: BLE001 - the benchmark's figures stand without it
        return f"not profiled: {exc}"


def triton_row(dtype: str, n: int) -> dict[str, Any]:
    """Triton's matmul tutorial kernel autotuned over 8 configurations vs torch cuBLAS."""
    try:
        from triton_matmul import matmul_ratio  # type: ignore[import-not-found]
    except ImportError as exc:
        return {"error": f"triton unavailable: {exc}"}
    return dict(matmul_ratio(dtype, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300, help="trials per search at most")
    parser.add_argument("--paper-trials", type=int, default=40,
                        help="trials per paper sequence at most")
    parser.add_argument("--seconds", type=float, default=120, help="time box per search")
    parser.add_argument("--configs", default="float32:4096,float16:4096,bfloat16:4096,"
                                              "float32:8192,float16:8192,bfloat16:8192")
    parser.add_argument("--no-paper", action="store_true", help="skip the paper rows")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton rows")
    parser.add_argument("--profile", action="store_true",
                        help="Nsight Compute on each search's best variant")
    parser.add_argument("--results", default="results-bench")
    parser.add_argument("--study", help="continue (or start) the studies NAME-<dtype>-<n> "
                                        "in --results instead of fresh ones")
    parser.add_argument("--warm-start", action="store_true",
                        help="start each search from the best of the dtype's search before")
    parser.add_argument("--ask-ahead", type=int, default=-1,
                        help="the searches' --ask-ahead (default: peak-tune's)")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="the searches' --in-flight (default: peak-tune's)")
    parser.add_argument("--build-budget", type=float, default=BUILD_BUDGET,
                        help="the searches' --build-budget (default: peak-tune's)")
    parser.add_argument("--confirm", action="store_true",
                        help="re-time each search's best beside the vendor at its end "
                             "(peak-tune's end-of-run confirmation; the time box skips it)")
    parser.add_argument("--device", default="h200",
                        help="the GPU's profile (h200, h100, ...)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "cuda_matmul.json"))
    args = parser.parse_args()
    paper = tomllib.loads(PAPER.read_text()) if PAPER.exists() else {}
    rows = []
    searched: dict[str, str] = {}  # dtype -> its last search study (for --warm-start)
    for config in args.configs.split(","):
        dtype, n = config.split(":")
        row: dict[str, Any] = {"dtype": dtype, "n": int(n)}
        named = f"{args.study}-{dtype}-{n}" if args.study else None
        warm = (searched[dtype],) if args.warm_start and dtype in searched else ()
        row["search"] = study_row(dtype, int(n), args.trials, Path(args.results),
                                  args.seconds, profile=args.profile, study=named,
                                  warm_start=warm, ask_ahead=args.ask_ahead,
                                  build_budget=args.build_budget, confirm=args.confirm,
                                  device=args.device, in_flight=args.in_flight)
        row["search"]["warm_start"] = list(warm)
        searched[dtype] = row["search"]["study"]
        row["paper"] = {
            name: study_row(dtype, int(n), args.paper_trials, Path(args.results),
                            args.seconds / 2, tuple(seq["sequence"]),
                            study=f"{named}-{name}" if named else None, device=args.device)
            for name, seq in paper.items() if seq["dtype"] == dtype and not args.no_paper}
        row["triton"] = {} if args.no_triton else triton_row(dtype, int(n))
        rows.append(row)
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    record = {"benchmark": "cuda_matmul", **provenance(), "device": _driver(), "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")
    print(f"{'dtype':<8} {'n':>5} {'search/cuBLAS':>13} {'trials':>6} {'trials/s':>8} "
          f"{'search trials/s':>15} {'paper/cuBLAS':>24} {'triton/cuBLAS':>13}  best sequence")
    for r in rows:
        s = r["search"]
        paper_ratios = ", ".join(f"{k} {v['ratio']:.3f}" for k, v in r["paper"].items()
                                 if v.get("ratio"))
        triton = r["triton"].get("ratio")
        print(f"{r['dtype']:<8} {r['n']:>5} {s['ratio'] or 0:>13.3f} "
              f"{s['trials']['total']:>6} {s['trials_per_second']:>8.2f} "
              f"{s['trials_per_search_second']:>15.2f} "
              f"{paper_ratios or '-':>24} {triton if triton is not None else '-':>13}  "
              f"{' > '.join(s['best']['sequence'])}")
        print(f"    time: {s['time']}")
        if "ncu" in s:
            print(f"    ncu: {s['ncu']}")


if __name__ == "__main__":
    main()
