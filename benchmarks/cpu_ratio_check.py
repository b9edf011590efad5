"""CPU ratio check: the ratio the README's first command prints against the truth.

Runs `peak-tune --trials N --json` in a fresh results folder (the README's first command),
exports its best kernel (`peak-tune export`), builds it with the C backend's flags and
times it and numpy's matmul alone, side by side: alternating rounds, each side in a fresh
process of its own (in one process, the threads OpenBLAS and OpenMP leave spinning after
a call slow the other side), the caches flushed before every run. Then it runs the same
command again (a new study answered by the cache). The target (issue 15): the printed
ratio is within 10% of the ratio timed alone, and the cached re-run prints the same
ratio. Meant for a quiet machine: other processes' CPU use during the side-by-side timing
is recorded, and the check says so when the machine was not quiet.

    python benchmarks/cpu_ratio_check.py --trials 100 --out benchmarks/results/...json

Prints a short table last and writes the full JSON (date, device, commands, commit,
figures with their spread); exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from provenance import commit  # benchmarks/ is the script's folder

from peak_tune.backends.c import FLAGS, CBackend
from peak_tune.catalog.resolve import Catalog
from peak_tune.harness.noise import MAX_FOREIGN_CORES, ForeignLoad
from peak_tune.harness.vendor import load_average

TOLERANCE = 0.10  # the printed ratio within 10% of the one timed alone
_FLUSH_BYTES = 64 << 20


def _peak_tune(*args: str) -> tuple[list[str], dict[str, Any]]:
    """Run the CLI; (the command, its JSON summary)."""
    command = [sys.executable, "-m", "peak_tune.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return command, json.loads(done.stdout.strip().splitlines()[-1])


def _export(results: Path, study: str, out: Path) -> list[str]:
    command = [sys.executable, "-m", "peak_tune.cli", "export", "--results", str(results),
               "--study", study, "-o", str(out)]
    subprocess.run(command, capture_output=True, text=True, check=True)
    return command


def _build(source: Path) -> Path:
    library = source.with_suffix(".so")
    subprocess.run(["gcc", *FLAGS, "-DDTYPE=float", "-o", str(library), str(source), "-lm"],
                   capture_output=True, text=True, check=True)
    return library


def _timed_ms(call: Callable[[], None], flush: np.ndarray) -> float:
    flush += 1.0  # evict the caches, as the harness does before every timed run
    started = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - started) / 1e6


def _summary(samples_ms: list[float], flops: float) -> dict[str, Any]:
    median = statistics.median(samples_ms)
    return {"samples_ms": samples_ms, "median_ms": median, "gflops": flops / median / 1e6,
            "min_gflops": flops / max(samples_ms) / 1e6,
            "max_gflops": flops / min(samples_ms) / 1e6,
            "spread": (max(samples_ms) - min(samples_ms)) / median}


def _one_side(side: str, library: str, size: dict[str, int], repeats: int) -> list[float]:
    """In a process of its own: one warm-up, then `repeats` timed runs of the kernel or of
    numpy, in ms (the other side's threads are gone, as in the tuner, where each runs in
    a job of its own)."""
    m, n, k = size["M"], size["N"], size["K"]
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    if side == "kernel":
        function = ctypes.CDLL(library).matmul
        pointer = ctypes.POINTER(ctypes.c_float)
        function.argtypes = [pointer, pointer, pointer, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int]
        args = (a.ctypes.data_as(pointer), b.ctypes.data_as(pointer),
                c.ctypes.data_as(pointer), m, n, k)

        def call() -> None:
            function(*args)
    else:
        def call() -> None:
            np.matmul(a, b, out=c)
    flush = np.ones(_FLUSH_BYTES // 8)
    call()
    return [_timed_ms(call, flush) for _ in range(repeats)]


def _time_side(side: str, library: Path, size: dict[str, int], repeats: int) -> list[float]:
    label = f"{size['M']}x{size['N']}x{size['K']}"
    done = subprocess.run([sys.executable, __file__, "--time-one", side, "--library",
                           str(library), "--size", label, "--repeats", str(repeats)],
                          capture_output=True, text=True, check=True)
    return [float(v) for v in json.loads(done.stdout)]


def time_alone(source: Path, size: dict[str, int], rounds: int, repeats: int
               ) -> dict[str, Any]:
    """The exported kernel and numpy at `size`, nothing else of ours running: each round
    times both, each in a process of its own, in alternating order."""
    m, n, k = size["M"], size["N"], size["K"]
    library = _build(source)
    error = _kernel_error(library, size)
    kernel_ms: list[float] = []
    numpy_ms: list[float] = []
    meter, load_before = ForeignLoad(), load_average()
    for index in range(rounds):
        order = ("kernel", "numpy") if index % 2 == 0 else ("numpy", "kernel")
        for side in order:
            samples = _time_side(side, library, size, repeats)
            (kernel_ms if side == "kernel" else numpy_ms).extend(samples)
    flops = 2.0 * m * n * k
    kernel_figure, numpy_figure = _summary(kernel_ms, flops), _summary(numpy_ms, flops)
    return {"size": size, "rounds": rounds, "repeats": repeats, "max_error": error,
            "kernel": kernel_figure, "numpy": numpy_figure,
            "ratio": kernel_figure["gflops"] / numpy_figure["gflops"],
            "other_processes_cores": meter.cores(),
            "load_average": [load_before, load_average()],
            "method": "each side timed in a fresh process per round (one warm-up, then "
                      "the repeats, caches flushed before each), sides alternating"}


def _kernel_error(library: Path, size: dict[str, int]) -> float:
    """The exported kernel's largest error against float64, relative to |A| @ |B|."""
    m, n, k = size["M"], size["N"], size["K"]
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    pointer = ctypes.POINTER(ctypes.c_float)
    function = ctypes.CDLL(str(library)).matmul
    function.argtypes = [pointer, pointer, pointer, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    function(a.ctypes.data_as(pointer), b.ctypes.data_as(pointer), c.ctypes.data_as(pointer),
             m, n, k)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.max(np.abs(c - reference) / (np.abs(a) @ np.abs(b) + 1e-30)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--size", help="as --size of peak-tune (default: the README's, none)")
    parser.add_argument("--rounds", type=int, default=15, help="side-by-side rounds")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per round each")
    parser.add_argument("--out", help="JSON file (default: $OUT/cpu_ratio_check.json)")
    parser.add_argument("--time-one", choices=("kernel", "numpy"), help=argparse.SUPPRESS)
    parser.add_argument("--library", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_one:  # a child of time_alone
        samples = _one_side(args.time_one, args.library, _size_of(args.size), args.repeats)
        print(json.dumps(samples))
        return 0
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "cpu_ratio_check.json")
    with tempfile.TemporaryDirectory(prefix="peak-tune-ratio-") as folder:
        results = Path(folder) / "results"
        tune = ["--trials", str(args.trials), "--json", "--results", str(results)]
        if args.size:
            tune += ["--size", args.size]
        command, tuned = _peak_tune(*tune)
        source = Path(folder) / "best.c"
        export = _export(results, tuned["study"], source)
        size = _size_of(tuned["sizes"][0])
        alone = time_alone(source, size, args.rounds, args.repeats)
        _, cached = _peak_tune(*tune)
    report = _report(args, command, export, tuned, alone, cached)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    _print_table(report, out)
    return 0 if report["checks"]["within_tolerance"] and report["checks"]["cached_same"] else 1


def _size_of(label: str) -> dict[str, int]:
    m, n, k = (int(v) for v in label.split("x"))
    return {"M": m, "N": n, "K": k}


def _report(args: argparse.Namespace, command: list[str], export: list[str],
            tuned: dict[str, Any], alone: dict[str, Any], cached: dict[str, Any]
            ) -> dict[str, Any]:
    backend = CBackend(Catalog.with_user_folders().device("cpu"))
    try:
        device = dict(backend.fingerprint())
        peaks = dict(backend.probe().peak_gflops)
    finally:
        backend.close()
    printed, truth = tuned["ratio"] or 0.0, alone["ratio"]
    quiet = alone["other_processes_cores"] <= MAX_FOREIGN_CORES
    return {
        "benchmark": "cpu_ratio_check",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device, "peak_gflops": peaks, "commit": commit(),
        "command": " ".join(command[2:]).replace("peak_tune.cli", "peak-tune"),
        "export": " ".join(export[2:]).replace("peak_tune.cli", "peak-tune"),
        "trials": args.trials,
        "printed": {"ratio": tuned["ratio"], "ratio_noisy": tuned.get("ratio_noisy"),
                    "best": tuned["best"], "vendor": tuned["vendor"],
                    "trials": tuned["trials"], "seconds": tuned["seconds"]},
        "alone": alone,
        "cached": {"ratio": cached["ratio"], "ratio_noisy": cached.get("ratio_noisy"),
                   "study": cached["study"], "cache": cached["cache"],
                   "vendor": cached["vendor"]},
        "checks": {
            "printed_over_alone": printed / truth if truth else None,
            "within_tolerance": bool(truth) and abs(printed / truth - 1) <= TOLERANCE,
            "cached_same": cached["ratio"] == tuned["ratio"],
            "quiet_machine": quiet,
        },
    }


def _print_table(report: dict[str, Any], out: Path) -> None:
    printed, alone, checks = report["printed"], report["alone"], report["checks"]
    vendor = printed["vendor"]
    rows = [
        ("printed ratio", f"{printed['ratio']:.3f}"
         f"{' (noisy)' if printed['ratio_noisy'] else ''}  best {printed['best']['gflops']:.1f}"
         f" / vendor {vendor['gflops']:.1f} GFLOP/s ({vendor.get('timings', '?')} timings)"),
        ("alone ratio", f"{alone['ratio']:.3f}  kernel {alone['kernel']['gflops']:.1f} "
         f"(spread {100 * alone['kernel']['spread']:.0f}%) / numpy "
         f"{alone['numpy']['gflops']:.1f} GFLOP/s (spread {100 * alone['numpy']['spread']:.0f}%)"),
        ("cached ratio", f"{report['cached']['ratio']:.3f}"),
        ("printed/alone", f"{checks['printed_over_alone']:.3f}: "
         f"{'within' if checks['within_tolerance'] else 'OUTSIDE'} {100 * TOLERANCE:.0f}%"),
        ("cached same", "yes" if checks["cached_same"] else "NO"),
        ("quiet machine", "yes" if checks["quiet_machine"] else
         f"NO: other processes used {alone['other_processes_cores']:.2f} cores"),
    ]
    print(f"wrote {out}")
    for name, value in rows:
        print(f"{name:<14} {value}")


if __name__ == "__main__":
    sys.exit(main())
