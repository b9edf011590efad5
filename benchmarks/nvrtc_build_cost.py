"""What a transformation costs in NVRTC build time and registers, without a GPU.

Builds the reference applier's kernels for a device profile (`--device`, default h100)
at one tuning point, once to warm up, then each `--runs` times in turn (A B A B ...:
the machine's drift hits both), through the CUDA backend's compile (NVRTC in a process
of its own, as a study's build workers run it), and prints each kernel's median, min and
max build seconds, the ratio to the first kernel pair by pair, and what ptxas reports
(registers, local memory). Needs the NVRTC wheels, not a GPU: run it on a quiet machine.

    python3 benchmarks/nvrtc_build_cost.py --runs 5 \
        --kernels "persistent;persistent,stream-k"

`--phases` also times each kernel's build by NVRTC's own phases (its `--time` report:
the C++ front end, the NVVM optimizer, the PTX translation by ptxas), the median of
`--runs` builds in this process, and the front end of an empty kernel that includes the
same headers: what a precompiled header could save at most.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from cuda_reference_check import ROOT, build, values  # benchmarks/ is the script's folder
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends._nvrtc import compile_cubin
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device
from peak_tune.core import KernelContext

# the tma-store persistent kernel's steps before the ones compared
PREFIX = ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining", "wgmma",
          "warp-specialize", "block-swizzle", "tma", "register-budget", "tma-store")
POINT = {"BLOCK_M": 128, "BLOCK_N": 256, "TILE_K_SIZE": 64, "NUM_STAGES": 4, "WGMMA_N": 256,
         "SWIZZLE_GROUP": 8, "PRODUCER_REGS": 40, "SK_DOWNWARDS": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h100")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--kernels", default="persistent;persistent,stream-k",
                        help="steps after the tma-store prefix, ';' between kernels")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    parser.add_argument("--phases", action="store_true",
                        help="also time NVRTC's phases for each kernel (its --time report)")
    args = parser.parse_args()
    device = load_device(ROOT / "backends" / "devices" / f"{args.device}.toml")
    kernels = [tuple(k.split(",")) for k in args.kernels.split(";")]
    contexts = [build(PREFIX + steps, device) for steps in kernels]
    backend = CudaBackend(device)
    seconds: list[list[float]] = [[] for _ in kernels]
    resources: list[dict[str, int]] = [{} for _ in kernels]
    with tempfile.TemporaryDirectory() as folder:
        for run in range(-1, args.runs):  # run -1: a warm-up, not counted
            for i, context in enumerate(contexts):
                started = time.perf_counter()
                artifact = backend.compile(context, values(context, POINT), args.dtype,
                                           str(Path(folder) / f"{run}-{i}"))
                if run >= 0:
                    seconds[i].append(time.perf_counter() - started)
                resources[i] = dict(artifact.resources)
    phases = ([_phases(backend, context, values(context, POINT), args.dtype, args.runs)
               for context in contexts] if args.phases else [])
    rows = []
    for steps, times, used in zip(kernels, seconds, resources, strict=True):
        ratios = [t / b for t, b in zip(times, seconds[0], strict=True)]
        rows.append({"kernel": "+".join(steps), "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times),
                     "ratio_median": statistics.median(ratios), "resources": used})
        print(f"{'+'.join(steps):40} {statistics.median(times):6.2f} s "
              f"({min(times):.2f}-{max(times):.2f}), x{statistics.median(ratios):.2f} "
              f"of the first, {used}")
    for row, phase in zip(rows, phases, strict=False):
        row["phases_ms"] = phase
        print(f"{row['kernel']:40} " + ", ".join(f"{k} {v:.0f} ms" for k, v in phase.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({
            **provenance(),
            "device_profile": args.device, "dtype": args.dtype, "point": POINT,
            "runs": args.runs, "rows": rows}, indent=1))
    return 0


def _phases(backend: CudaBackend, context: KernelContext, params: dict[str, int], dtype: str,
            runs: int) -> dict[str, float]:
    """NVRTC's --time report for the kernel (median ms per phase over `runs` builds), and
    the front end of an empty kernel with the kernel's #include lines ("headers only")."""
    options = [*backend.nvrtc_options(params, dtype), *backend.include_flags()]
    includes = "".join(line + "\n" for line in context.source.splitlines()
                       if line.startswith("#include"))
    by_phase: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "time.csv"
        for source, only in ((context.source, None), (includes + "__global__ void k() {}\n",
                                                      "headers only")):
            for _ in range(runs):
                report.unlink(missing_ok=True)
                compile_cubin(source, [*options, f"--time={report}"])
                for line in report.read_text().splitlines()[1:]:
                    _, phase, value, unit = (part.strip() for part in line.split(","))
                    if unit == "ms" and (only is None or phase == "CUDA C++ Frontend"):
                        by_phase.setdefault(only or phase, []).append(float(value))
    return {phase: statistics.median(ms) for phase, ms in by_phase.items()}


if __name__ == "__main__":
    raise SystemExit(main())
