"""What a transformation costs in NVRTC build time and registers, without a GPU.

Builds the reference applier's kernels for a device profile (`--device`, default h100)
at one tuning point, once to warm up, then each `--runs` times in turn (A B A B ...:
the machine's drift hits both), through the CUDA backend's compile (NVRTC in a process
of its own, as a study's build workers run it), and prints each kernel's median, min and
max build seconds, the ratio to the first kernel pair by pair, and what ptxas reports
(registers, local memory). Needs the NVRTC wheels, not a GPU: run it on a quiet machine.

    python3 benchmarks/nvrtc_build_cost.py --runs 5 \
        --kernels "persistent;persistent,stream-k"
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

from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device

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
    rows = []
    for steps, times, used in zip(kernels, seconds, resources, strict=True):
        ratios = [t / b for t, b in zip(times, seconds[0], strict=True)]
        rows.append({"kernel": "+".join(steps), "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times),
                     "ratio_median": statistics.median(ratios), "resources": used})
        print(f"{'+'.join(steps):40} {statistics.median(times):6.2f} s "
              f"({min(times):.2f}-{max(times):.2f}), x{statistics.median(ratios):.2f} "
              f"of the first, {used}")
    if args.out:
        Path(args.out).write_text(json.dumps({
            **provenance(),
            "device_profile": args.device, "dtype": args.dtype, "point": POINT,
            "runs": args.runs, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
