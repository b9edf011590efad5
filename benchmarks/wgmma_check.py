"""The wgmma transformation on this machine's Hopper GPU, side by side with cuBLAS.

Builds the reference applier's wgmma sequence, with warp-specialize, and each of the two
with address-hoisting or tma, and the persistent and cluster kernels (`--kernels`; a
persistent one has one block per SM walking the output tiles, a cluster one shares its B
tiles between the blocks of a cluster, a ping-pong one has two groups of MMA warpgroups
taking the output tiles in turn, a stream-k one shares the last partial wave's K tiles
evenly among the blocks and is also validated at sizes where that wave exists), at the
same hand-picked tuning points
(`--points N`: the first N; the ping-pong kernels' base points also at --odd),
then compiles, validates (the spec's check sizes and the small odd ones of
cuda_reference_check: 1x1x1, 31x17x5, 130x129x2) and times each through the CUDA backend
at --size, fp16 in and out with fp32 accumulation; cuBLAS is timed by the same worker.
The best point is timed again at the odd size --odd. A few variants (split-k,
launch-bounds, misaligned K) are validated only (`--validate A,B`: those whose labels
contain A or B). Prints a table last and writes JSON to
$OUT (or ./results).

    python3 benchmarks/wgmma_check.py [--size 4096] [--odd 4093] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cuda_reference_check import (  # benchmarks/ is the script's folder
    EXTRA_CHECKS,
    ROOT,
    Runner,
    build,
    output_folder,
    this_gpu_profile,
    time_vendors,
    values,
)
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends.base import EvalConfig
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_spec
from peak_tune.core import ProblemSize

WGMMA = ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining", "wgmma",
         "block-swizzle")
# warp-specialize: a producer warpgroup copies, mbarriers instead of __syncthreads
SPECIALISED = (*WGMMA[:-1], "warp-specialize", "block-swizzle")
PINGPONG = (*SPECIALISED, "tma", "register-budget", "tma-store", "persistent", "ping-pong")
STREAM_K = (*SPECIALISED, "tma", "register-budget", "tma-store", "persistent", "stream-k")
CLUSTER_PINGPONG = (*SPECIALISED, "tma", "register-budget", "cluster-multicast", "tma-store",
                    "persistent", "ping-pong")
# timed side by side at every point, by the prefix of their rows' names
KERNELS = {"": WGMMA, "ws ": SPECIALISED, "hoisted ": (*WGMMA, "address-hoisting"),
           "ws hoisted ": (*SPECIALISED, "address-hoisting"), "tma ": (*WGMMA, "tma"),
           "ws tma ": (*SPECIALISED, "tma"),
           # persistent: one block per SM walks the output tiles
           "persistent ": (*SPECIALISED, "persistent"),
           "persistent tma ": (*SPECIALISED, "tma", "persistent"),
           "persistent tma hoisted ": (*SPECIALISED, "tma", "address-hoisting", "persistent"),
           # register-budget: setmaxnreg, PRODUCER_REGS for the producer, the rest the MMAs'
           "budget tma persistent ": (*SPECIALISED, "tma", "register-budget", "persistent"),
           # cluster-multicast: CLUSTER_M blocks down a column share each B tile (TMA
           # multicast); "cluster4" rows with CLUSTER_M = 4 (KERNEL_VALUES)
           "cluster tma ": (*SPECIALISED, "tma", "cluster-multicast"),
           "cluster tma persistent ": (*SPECIALISED, "tma", "cluster-multicast", "persistent"),
           "budget cluster tma persistent ": (*SPECIALISED, "tma", "register-budget",
                                              "cluster-multicast", "persistent"),
           "budget cluster4 tma persistent ": (*SPECIALISED, "tma", "register-budget",
                                               "cluster-multicast", "persistent"),
           # tma-store: C through swizzled shared slabs, stored by TMA
           "budget tma store persistent ": (*SPECIALISED, "tma", "register-budget",
                                            "tma-store", "persistent"),
           "budget cluster tma store persistent ": (*SPECIALISED, "tma", "register-budget",
                                                    "cluster-multicast", "tma-store",
                                                    "persistent"),
           # ping-pong: two groups of MMA warpgroups take the output tiles in turn, at
           # 64 x 256 (one warpgroup a group) and 128 x 128 (two): KERNEL_VALUES
           "budget tma store persistent pingpong ": PINGPONG,
           "budget tma store persistent pingpong128 ": PINGPONG,
           "budget tma persistent pingpong ": (*SPECIALISED, "tma", "register-budget",
                                               "persistent", "ping-pong"),
           # ... and with clusters of 2 (4: cluster4) sharing each B tile
           "budget cluster tma store persistent pingpong ": CLUSTER_PINGPONG,
           "budget cluster4 tma store persistent pingpong ": CLUSTER_PINGPONG,
           # stream-k: the last partial wave's K tiles shared out evenly among the blocks
           "budget tma store persistent streamk ": STREAM_K}
# a kernel's own values over BASE and the point's
KERNEL_VALUES = {"budget cluster4 tma persistent ": {"CLUSTER_M": 4},
                 "budget tma store persistent pingpong ": {"BLOCK_M": 64},
                 "budget tma store persistent pingpong128 ": {"BLOCK_M": 128, "BLOCK_N": 128,
                                                              "WGMMA_N": 128},
                 "budget tma persistent pingpong ": {"BLOCK_M": 64},
                 "budget cluster tma store persistent pingpong ": {"BLOCK_M": 64},
                 "budget cluster4 tma store persistent pingpong ": {"BLOCK_M": 64,
                                                                    "CLUSTER_M": 4}}
# also timed at --odd (TMA cannot map it: the cp.async copies and plain stores), where a
# block's tiles are many and the two groups' turns are checked by the timed run's
# projection
AT_ODD = ("budget tma store persistent pingpong ", "budget cluster tma store persistent pingpong ",
          "budget tma store persistent streamk ")
# stream-k kernels are also validated where the output tiles overflow one wave of blocks
# (at the spec's check sizes they never do): at 128 x 256 on 132 SMs 162 tiles leave 30
# whose K tiles spread over several blocks each (K = 999: no tensor maps, cp.async and
# plain stores), 144 tiles of 4 K tiles leave runs of 0 or 1 K tile (empty runs); at
# 64 x 128, 224 tiles leave 92
STREAM_K_CHECKS = tuple(ProblemSize.of(dict(zip("MNK", s, strict=True)))
                        for s in ((2304, 2304, 1000), (2200, 2100, 999), (1100, 4000, 200),
                                  (1000, 1700, 500)))
BASE = {"BLOCK_M": 128, "BLOCK_N": 256, "TILE_K_SIZE": 64, "NUM_STAGES": 4, "WGMMA_N": 256,
        "SWIZZLE_GROUP": 8, "K_SPLITS": 3, "MIN_BLOCKS_PER_SM": 1, "PRODUCER_REGS": 72,
        "CLUSTER_M": 2, "SK_DOWNWARDS": 1}
POINTS = (  # overrides of BASE, timed at --size; --points N times the first N
    {},
    {"NUM_STAGES": 3},
    {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3},
    {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 4},
    {"BLOCK_N": 128, "WGMMA_N": 128},
    {"BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 6},
    {"WGMMA_N": 128},
    {"BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3},
    {"BLOCK_M": 64, "BLOCK_N": 256, "NUM_STAGES": 4},
    {"BLOCK_N": 128, "WGMMA_N": 64, "NUM_STAGES": 4},
    {"SWIZZLE_GROUP": 16},
    {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 2},
    {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 64, "NUM_STAGES": 4},
    {"WGMMA_N": 128, "NUM_STAGES": 3},
    {"BLOCK_M": 256, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 4},
)
VALIDATE_ONLY = (  # (label, sequence, overrides): odd sizes only
    ("split-k", WGMMA + ("split-k",), {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("launch-bounds", WGMMA + ("launch-bounds",), {}),
    ("small tile 64x64 2 stages", WGMMA, {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64,
                                          "NUM_STAGES": 2}),
    ("specialised", SPECIALISED, {}),
    ("specialised split-k", SPECIALISED + ("split-k",), {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("specialised launch-bounds", SPECIALISED + ("launch-bounds",), {}),
    ("specialised 64x64 3 stages", SPECIALISED, {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64,
                                                 "NUM_STAGES": 3}),
    ("hoisted split-k", KERNELS["hoisted "] + ("split-k",), {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("specialised hoisted split-k", KERNELS["ws hoisted "] + ("split-k",),
     {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("specialised 256x128 TK128", SPECIALISED, {"BLOCK_M": 256, "BLOCK_N": 128,
                                                "WGMMA_N": 128, "TILE_K_SIZE": 128,
                                                "NUM_STAGES": 3, "K_SPLITS": 2}),
    ("tma", KERNELS["tma "], {}),
    ("tma split-k", KERNELS["tma "] + ("split-k",), {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("specialised tma", KERNELS["ws tma "], {}),
    ("specialised tma split-k", KERNELS["ws tma "] + ("split-k",),
     {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("specialised tma hoisted 256x128 TK128", KERNELS["ws tma "] + ("address-hoisting",),
     {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "TILE_K_SIZE": 128, "NUM_STAGES": 3}),
    ("persistent 64x64 3 stages", KERNELS["persistent "],
     {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 3}),
    ("persistent tma 64x64 3 stages", KERNELS["persistent tma "],
     {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 3}),
    # clusters past the last block row (200 rows: 2 of 128, 4 of 64) compute zeros
    ("cluster tma", KERNELS["cluster tma "], {}),
    ("cluster 4 tma 64x64 3 stages", KERNELS["cluster tma "],
     {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 3, "CLUSTER_M": 4}),
    ("cluster tma persistent swizzled 4", KERNELS["cluster tma persistent "],
     {"CLUSTER_M": 4, "SWIZZLE_GROUP": 4}),
    ("budget cluster tma persistent 256x128", KERNELS["budget cluster tma persistent "],
     {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3}),
    # C's map clips the edge tiles (200 x 136); odd sizes store without TMA
    ("tma store", (*SPECIALISED, "tma", "tma-store"), {}),
    ("tma store 64x64 persistent", KERNELS["budget tma store persistent "],
     {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 3}),
    ("cluster 4 tma store persistent", KERNELS["budget cluster tma store persistent "],
     {"CLUSTER_M": 4, "NUM_STAGES": 3}),
    ("ping-pong 64x256", (*SPECIALISED, "persistent", "ping-pong"), {"BLOCK_M": 64}),
    ("ping-pong tma store 128x128", PINGPONG, {"BLOCK_N": 128, "WGMMA_N": 128}),
    ("ping-pong tma store 64x64", PINGPONG, {"BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64,
                                             "NUM_STAGES": 3}),
    ("ping-pong cluster 4 tma store 64x256", CLUSTER_PINGPONG, {"BLOCK_M": 64,
                                                                "CLUSTER_M": 4}),
    ("stream-k", STREAM_K, {}),
    ("stream-k 64x128 6 stages", STREAM_K, {"BLOCK_M": 64, "BLOCK_N": 128, "WGMMA_N": 128,
                                            "NUM_STAGES": 6}),
    ("stream-k cp.async no budget 64x128", (*SPECIALISED, "persistent", "stream-k"),
     {"BLOCK_M": 64, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 4}),
)


def checks_for(sequence: tuple[str, ...], checks: tuple[ProblemSize, ...]
               ) -> tuple[ProblemSize, ...]:
    return checks + STREAM_K_CHECKS if "stream-k" in sequence else checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--odd", type=int, default=4093)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--points", type=int, default=len(POINTS),
                        help="time only the first N points")
    parser.add_argument("--kernels", default=",".join(k.strip() or "plain" for k in KERNELS),
                        help="the kernels to time, by name (plain, ws, hoisted, ...)")
    parser.add_argument("--validate", default="",
                        help="validate only the variants whose label contains one of these "
                             "(comma-separated; default: all)")
    args = parser.parse_args()
    chosen = {k for k in KERNELS if (k.strip() or "plain") in args.kernels.split(",")}
    device = this_gpu_profile()
    spec = load_spec(ROOT / "seeds" / "matmul")
    # K and N multiples of 8, tiles cut at every edge: TMA maps them (odd sizes it cannot)
    checks = spec.check_sizes + EXTRA_CHECKS + (ProblemSize.of({"M": 200, "N": 136, "K": 1001}),
                                                ProblemSize.of({"M": 200, "N": 136, "K": 1000}))
    config = EvalConfig(timeout_s=60.0, warmup=3, repeats=args.repeats, max_timing_s=5.0)
    sizes = {"square": ProblemSize.of({"M": args.size, "N": args.size, "K": args.size}),
             "odd": ProblemSize.of({"M": args.odd, "N": args.odd, "K": args.odd})}
    out: dict[str, Any] = {**provenance(),
                           "device_profile": device.name,
                           "sizes": {k: v.as_dict() for k, v in sizes.items()},
                           "checks": [c.as_dict() for c in checks], "vendor": {}, "timed": [],
                           "validated": []}
    folder = output_folder()
    build_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "peak-tune-wgmma"

    def save() -> None:
        (folder / "wgmma_check.json").write_text(json.dumps(out, indent=1))

    with CudaBackend(device) as backend:
        out["fingerprint"] = dict(backend.fingerprint())
        runner = Runner(backend, config, build_dir)
        out["vendor"] = time_vendors(backend, "float16", sizes, config)
        small = ProblemSize.of({"M": 256, "N": 192, "K": 320})
        wanted = [w for w in args.validate.split(",") if w]
        for label, sequence, override in VALIDATE_ONLY:
            if wanted and not any(w in label for w in wanted):
                continue
            context = build(sequence, device)
            params = values(context, {**BASE, **override})
            result = runner.run(context, params, "float16", small, checks_for(sequence, checks))
            out["validated"].append({"name": label, "sequence": list(sequence),
                                     "params": params, **result})
            print(f"validate {label:30} {result['status']} {result.get('message', '')[:300]}",
                  flush=True)
            save()
        contexts = {prefix: build(sequence, device) for prefix, sequence in KERNELS.items()
                    if prefix in chosen}
        for override in POINTS[:args.points]:
            for prefix, context in contexts.items():
                try:
                    params = values(context, {**BASE, **override,
                                              **KERNEL_VALUES.get(prefix, {})})
                except ValueError as exc:  # e.g. warp-specialize's threads or stages
                    print(f"skipped {prefix}{override}: {exc}", flush=True)
                    continue
                result = runner.run(context, params, "float16", sizes["square"],
                                    checks_for(context.applied, checks))
                name = prefix + (", ".join(f"{k}={v}" for k, v in override.items()) or "base")
                out["timed"].append({"name": name, "kernel": prefix, "params": params,
                                     "size": "square", "sequence": list(context.applied),
                                     **result})
                print(f"timed {name:50} {result['status']} {result.get('gflops', 0):8.0f} "
                      f"{result.get('resources', '')} {result.get('message', '')[:300]}",
                      flush=True)
                if prefix in AT_ODD and not override:
                    result = runner.run(context, params, "float16", sizes["odd"], ())
                    out["timed"].append({"name": f"{name} at odd", "kernel": prefix,
                                         "params": params, "size": "odd",
                                         "sequence": list(context.applied), **result})
                    print(f"timed {name} at odd: {result['status']} "
                          f"{result.get('gflops', 0):8.0f} {result.get('message', '')[:300]}",
                          flush=True)
                save()
        good = [t for t in out["timed"] if t["status"] == "ok" and t["size"] == "square"]
        if good:
            best = max(good, key=lambda t: t["gflops"])
            context = contexts[best["kernel"]]
            for _ in range(2):  # the best again: the spread between two runs
                result = runner.run(context, best["params"], "float16", sizes["square"], ())
                out["timed"].append({"name": f"best again ({best['name']})",
                                     "params": best["params"], "size": "square", **result})
            result = runner.run(context, best["params"], "float16", sizes["odd"], ())
            out["timed"].append({"name": f"best at odd ({best['name']})",
                                 "params": best["params"], "size": "odd", **result})
            save()
    print_table(out)
    save()
    return 0


def print_table(out: dict[str, Any]) -> None:
    fp = out["fingerprint"]
    print(f"\n{fp['device']}, driver {fp['driver']}, {fp['compiler']}, {fp['flags']}")
    for label, vendor in out["vendor"].items():
        print(f"  cuBLAS {label}: {vendor['gflops']:.0f} GFLOP/s")
    print(f"{'variant':56} {'size':6} {'GFLOP/s':>9} {'x cuBLAS':>9} {'regs':>5}  status")
    for r in out["timed"]:
        gflops = r.get("gflops", 0.0)
        ratio = gflops / out["vendor"][r["size"]]["gflops"]
        regs = r.get("resources", {}).get("registers", 0)
        print(f"{r['name'][:56]:56} {r['size']:6} {gflops:9.0f} {ratio:9.3f} {regs:5}  "
              f"{r['status']} {r.get('message', '')[:80]}")
    for r in out["validated"]:
        print(f"validated {r['name']:46} {r['status']} {r.get('message', '')[:80]}")


if __name__ == "__main__":
    sys.exit(main())
