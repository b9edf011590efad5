"""How many builds and timings a recorded CUDA landscape needed, by variant and by source.

Replays every sequence of each landscape (`benchmarks/results/landscapes/`) through the
CUDA reference applier for the landscape's device and counts the distinct builds its
evaluated points (status ok) need: keyed by the variant's whole identity (lineage, plan,
constraints: the build key before 2026-12-07) and keyed by what the compiler sees (source
and entry point: today's), each with the point's macro values; and the timings it needs keyed by
variant and by how the variant runs (KernelContext.run_identity: source, launch, sizes).
The differences are what commuting orders that print the same kernel no longer build and
time twice. CPU only.

    python3 benchmarks/build_sharing.py [--out results/FILE.json] [LANDSCAPE.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cuda_reference_check import ROOT, build  # benchmarks/ is the script's folder
from provenance import provenance  # benchmarks/ is the script's folder

from peak_tune.backends.cuda import profile_for_gpu
from peak_tune.catalog.loaders import load_devices
from peak_tune.core import stable_hash

LANDSCAPES = ROOT / "benchmarks" / "results" / "landscapes"


def count(path: Path) -> dict[str, object]:
    recorded = json.loads(path.read_text())
    # the recorded device is "NVIDIA H200, <driver>": its Hopper profile by name
    device = profile_for_gpu(recorded["device"], "sm_90",
                             load_devices([ROOT / "backends" / "devices"]).values())
    if device is None:
        raise SystemExit(f"{path.name}: no device profile for {recorded['device']}")
    keys: dict[tuple[str, ...], tuple[str, str, str]] = {}
    by_variant: set[tuple[str, str]] = set()
    by_source: set[tuple[str, str]] = set()
    by_run: set[tuple[str, str]] = set()
    points = [o for o in recorded["outcomes"] if o["status"] == "ok"]
    for point in points:
        sequence = tuple(point["sequence"])
        if sequence not in keys:
            context = build(sequence, device)
            keys[sequence] = (context.content_hash(), stable_hash(context.build_identity()),
                              stable_hash(context.run_identity()))
        variant, source, run = keys[sequence]
        values = stable_hash(sorted(point["params"].items()))
        by_variant.add((variant, values))
        by_source.add((source, values))
        by_run.add((run, values))
    return {"landscape": path.name, "device": recorded["device"], "dtype": recorded["dtype"],
            "points_ok": len(points), "sequences": len(keys),
            "variants": len({k[0] for k in keys.values()}),
            "sources": len({k[1] for k in keys.values()}),
            "builds_by_variant": len(by_variant), "builds_by_source": len(by_source),
            "saved": round(1 - len(by_source) / max(1, len(by_variant)), 3),
            "timings_by_variant": len(by_variant), "timings_by_run": len(by_run),
            "timings_saved": round(1 - len(by_run) / max(1, len(by_variant)), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="*", type=Path)
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    args = parser.parse_args()
    paths = args.landscapes or sorted(p for p in LANDSCAPES.glob("landscape-*.json"))
    rows = []
    for path in paths:
        row = count(path)
        rows.append(row)
        print(f"{row['landscape']:36} {row['points_ok']:5} points, {row['sequences']:4} "
              f"sequences -> {row['variants']:4} variants, {row['sources']:4} sources; "
              f"builds {row['builds_by_variant']:5} by variant, "
              f"{row['builds_by_source']:5} by source ({row['saved']:.1%} fewer); timings "
              f"{row['timings_by_run']:5} by run ({row['timings_saved']:.1%} fewer)",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            **provenance(),
            "device": "none (CPU: the reference applier replays the recorded sequences)",
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
