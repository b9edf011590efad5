"""What NVRTC's optimization flags cost in kernel speed and save in build seconds.

A study at 4096 is bound by its NVRTC builds (about 1.3 s each for a wgmma kernel, half
in NVVM, half in ptxas): a flag set that builds in a quarter of the time at the same
kernel speed would let the GPU try four times as many points. This builds the best
distinct points of recorded landscapes (`--landscape`, the top `--top` of each) and the
wgmma checks' tma-store kernel with each flag set (`--flags`, `;` between sets; the
first is the baseline), times every build, validates each kernel at the spec's check
sizes and times it at its landscape's size in one worker, the flag sets in a rotating
order, then times them all again in the opposite order (the spread between two rounds).
Prints the ratio of each flag set's speed and build seconds to the baseline's and
writes JSON to $OUT (or ./results).

    python3 benchmarks/compile_flags.py --landscape results/landscapes/landscape-float32-4096.json \
        --top 4 --flags "-std=c++17 -lineinfo;-std=c++17 -Ofc=mid"
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cuda_reference_check import ROOT, build, output_folder, row, this_gpu_profile, values
from provenance import provenance  # benchmarks/ is the script's folder

import peak_tune.backends.cuda as cuda_backend
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_spec
from peak_tune.core import ProblemSize

TMA_STORE = (("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining", "wgmma",
              "warp-specialize", "block-swizzle", "tma", "register-budget", "tma-store",
              "persistent"),
             {"BLOCK_M": 128, "BLOCK_N": 256, "TILE_K_SIZE": 64, "NUM_STAGES": 4,
              "WGMMA_N": 256, "SWIZZLE_GROUP": 8, "PRODUCER_REGS": 40})
DEFAULT_FLAGS = "-std=c++17 --ptxas-options=-v;-std=c++17 -lineinfo --ptxas-options=-v"


def best_points(path: Path, top: int) -> list[dict[str, Any]]:
    """The `top` fastest distinct (sequence, values) of a landscape, fastest first."""
    landscape = json.loads(path.read_text())
    timed = [o for o in landscape["outcomes"] if o["status"] == "ok" and o.get("samples_ms")]
    timed.sort(key=lambda o: statistics.median(o["samples_ms"]))
    chosen: list[dict[str, Any]] = []
    seen: set[str] = set()
    for outcome in timed:
        key = json.dumps([outcome["sequence"], sorted(outcome["params"].items())])
        if key not in seen:
            seen.add(key)
            chosen.append({"dtype": landscape["dtype"], "size": outcome["size"],
                           "sequence": tuple(outcome["sequence"]), "params": outcome["params"]})
        if len(chosen) == top:
            break
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape", action="append", default=[], type=Path)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--flags", default=DEFAULT_FLAGS,
                        help="flag sets, ';' between them; -arch and -D are added")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--size", type=int, default=0,
                        help="time every point at this square size (0: its landscape's)")
    args = parser.parse_args()
    flag_sets = [tuple(shlex.split(f)) for f in args.flags.split(";")]
    device = this_gpu_profile()
    spec = load_spec(ROOT / "seeds" / "matmul")
    points = [p for path in args.landscape for p in best_points(path, args.top)]
    points.append({"dtype": "float16", "size": "4096x4096x4096", "sequence": TMA_STORE[0],
                   "params": TMA_STORE[1]})
    if args.size:
        points = [{**p, "size": f"{args.size}x{args.size}x{args.size}"} for p in points]
    config = EvalConfig(timeout_s=60.0, warmup=3, repeats=args.repeats, max_timing_s=5.0)
    out: dict[str, Any] = {**provenance(),
                           "flag_sets": [" ".join(f) for f in flag_sets], "vendor": {},
                           "points": []}
    folder = output_folder()

    def save() -> None:
        (folder / "compile_flags.json").write_text(json.dumps(out, indent=1))

    with CudaBackend(device) as backend, tempfile.TemporaryDirectory() as build_dir:
        out["fingerprint"] = dict(backend.fingerprint())
        for number, point in enumerate(points):
            size = ProblemSize.of(dict(zip("MNK", map(int, point["size"].split("x")), strict=True)))
            vendor_key = f"{point['dtype']}:{point['size']}"
            if vendor_key not in out["vendor"]:
                name, m = backend.time_vendor(spec, point["dtype"], size, config)
                out["vendor"][vendor_key] = {"name": name, **row(m)}
            context = build(point["sequence"], device)
            params = values(context, point["params"])
            request = EvalRequest(spec, context, params, point["dtype"], size,
                                  spec.check_sizes, config)
            entry: dict[str, Any] = {**point, "sequence": list(point["sequence"]),
                                     "builds": {}, "rounds": [{}, {}]}
            artifacts = {}
            order = flag_sets[number % len(flag_sets):] + flag_sets[:number % len(flag_sets)]
            for flags in order:  # round 1: build and time, the first set moving each point
                label = " ".join(flags)
                cuda_backend.FLAGS = flags  # the one thing varied
                started = time.perf_counter()
                try:
                    artifacts[label] = backend.compile(context, params, point["dtype"],
                                                       build_dir)
                    entry["builds"][label] = {"seconds": round(time.perf_counter() - started, 3),
                                              "resources": dict(artifacts[label].resources)}
                    entry["rounds"][0][label] = row(backend.evaluate(artifacts[label], request))
                except Exception as exc:  # one broken build must not end the run
                    entry["builds"][label] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            for label in reversed(list(artifacts)):  # round 2: the opposite order
                try:
                    entry["rounds"][1][label] = row(backend.evaluate(artifacts[label], request))
                except Exception as exc:
                    entry["rounds"][1][label] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            out["points"].append(entry)
            save()
            print_point(entry, out["vendor"][vendor_key]["gflops"], flag_sets)
    save()
    return 0


def print_point(entry: dict[str, Any], vendor_gflops: float,
                flag_sets: list[tuple[str, ...]]) -> None:
    base = " ".join(flag_sets[0])
    print(f"\n{entry['dtype']} {entry['size']} {' '.join(entry['sequence'])} {entry['params']}")
    for flags in flag_sets:
        label = " ".join(flags)
        build_row = entry["builds"].get(label, {})
        if "error" in build_row:
            print(f"  {label:34} {build_row['error'][:100]}")
            continue
        speeds = [r[label]["gflops"] for r in entry["rounds"] if "gflops" in r.get(label, {})]
        base_speeds = [r[base]["gflops"] for r in entry["rounds"]
                       if "gflops" in r.get(base, {})]
        ratio = (statistics.median(speeds) / statistics.median(base_speeds)
                 if speeds and base_speeds else float("nan"))
        base_seconds = entry["builds"].get(base, {}).get("seconds", float("nan"))
        print(f"  {label:34} build {build_row['seconds']:5.2f} s "
              f"({build_row['seconds'] / base_seconds:4.2f}x)  "
              f"{' '.join(f'{s / 1000:7.1f}' for s in speeds)} TFLOP/s "
              f"({ratio:5.3f}x base, {max(speeds, default=0) / vendor_gflops:5.3f}x vendor)"
              f"  regs {build_row['resources'].get('registers', '?')}")


if __name__ == "__main__":
    sys.exit(main())
