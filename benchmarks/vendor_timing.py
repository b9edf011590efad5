"""Is cuBLAS's time the library's or the harness's? The same gemmEx timed several ways.

The ratios every CUDA study reports divide by cuBLAS as the GPU worker times it (fresh
inputs in fenced buffers for each run, L2 flushed, CUDA events around the one call;
two passes, the faster kept). This times the same call, each way after 3 s with the GPU
idle:
  - through the worker (`worker`), as a study does;
  - with the worker's own code in a process of its own, with the fenced buffers
    (`fenced`) and with plain allocations (`plain`: the fence switched off);
  - on three CuPy arrays with the L2 flushed before each call (`cupy flushed`) and back
    to back, 20 calls between two events (`cupy back to back`);
  - and through PyTorch where it is installed (`torch`),
and prints one line per way: a harness that makes cuBLAS slower than it is shows as
`worker` below `cupy flushed`. With --kernels (fp16), the fair comparison: a wgmma
kernel and cuBLAS, each timed in one process three ways with the same binder on the
same stream: as the harness times them (`harness`: fresh inputs every run), on one set
of inputs with the L2 flushed before each run (`same inputs, flushed`), and back to back
(`same inputs, back to back`).

    python3 benchmarks/vendor_timing.py [--configs float16:4096,float32:4096] [--repeats 20]
    python3 benchmarks/vendor_timing.py --configs float16:4096 --kernels
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peak_tune.backends.base import EvalConfig  # noqa: E402
from peak_tune.backends.wire import config_to_wire, spec_to_wire  # noqa: E402
from peak_tune.catalog.loaders import load_spec  # noqa: E402
from peak_tune.core import ProblemSize  # noqa: E402

SPEC = ROOT / "seeds" / "matmul"
WAYS = ("fenced", "plain")  # the worker's code in a process of its own


def _tflops(n: int, ms: float) -> float:
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def _summary(samples_ms: list[float], n: int) -> dict[str, Any]:
    median = statistics.median(samples_ms)
    return {"median_ms": median, "tflops": _tflops(n, median),
            "min_ms": min(samples_ms), "max_ms": max(samples_ms), "samples": len(samples_ms)}


def through_worker(dtype: str, n: int, repeats: int) -> dict[str, Any]:
    """The study's own path: CudaBackend.time_vendor (a separate worker process)."""
    from cuda_reference_check import this_gpu_profile  # benchmarks/ is the script's folder

    from peak_tune.backends.cuda import CudaBackend

    backend = CudaBackend(this_gpu_profile())
    time.sleep(IDLE_S)
    try:
        name, m = backend.time_vendor(load_spec(SPEC), dtype, ProblemSize.of(
            {"M": n, "N": n, "K": n}), EvalConfig(repeats=repeats))
    finally:
        backend.close()
    return {"name": name, **_summary(list(m.samples_ms), n)}


IDLE_S = 3.0  # the GPU idles this long before each way is timed


def in_process(dtype: str, n: int, repeats: int, way: str) -> dict[str, Any]:
    """The worker's `_vendor` handler called here, with or without the fence (in a
    process of its own: the fence is chosen once per process)."""
    from peak_tune.backends import _cuda_fence, _cuda_worker

    if way == "plain":
        _cuda_fence.FencedBlocks._load = lambda self: False  # type: ignore[method-assign]
    time.sleep(IDLE_S)
    reply = _cuda_worker._vendor({"spec": spec_to_wire(load_spec(SPEC)), "dtype": dtype,
                                  "size": {"M": n, "N": n, "K": n},
                                  "config": config_to_wire(EvalConfig(repeats=repeats)),
                                  "call": "gemm"})
    return _summary([float(x) for x in reply["samples_ms"]], n)


# wgmma_check's budget tma persistent kernel at its base point and at the study's best
KERNEL_POINTS = {"budget tma persistent 128x256x4": {},
                 "budget tma persistent 256x128x4": {"BLOCK_M": 256, "BLOCK_N": 128,
                                                     "WGMMA_N": 128, "SWIZZLE_GROUP": 2,
                                                     "PRODUCER_REGS": 96}}


def kernel_messages(dtype: str, n: int, repeats: int) -> dict[str, dict[str, Any]]:
    """The worker's "evaluate" messages for KERNEL_POINTS, built here (NVRTC)."""
    import tempfile

    from cuda_reference_check import build, this_gpu_profile, values
    from wgmma_check import BASE, KERNELS

    from peak_tune.backends.base import EvalRequest
    from peak_tune.backends.cuda import CudaBackend

    profile = this_gpu_profile()
    spec, size = load_spec(SPEC), ProblemSize.of({"M": n, "N": n, "K": n})
    context = build(KERNELS["budget tma persistent "], profile)
    folder = tempfile.mkdtemp(prefix="peak-tune-vendor-timing-")
    messages = {}
    with CudaBackend(profile) as backend:
        for label, overrides in KERNEL_POINTS.items():
            params = values(context, {**BASE, **overrides})
            artifact = backend.compile(context, params, dtype, folder)
            request = EvalRequest(spec, context, params, dtype, size, (),
                                  EvalConfig(repeats=repeats))
            messages[label] = backend._request(artifact, request, size)
    return messages


def controlled(message: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The kernel of `message` and cuBLAS, each timed three ways in this process with the
    worker's own binders on its stream (module docstring)."""
    from peak_tune.backends import _cuda_device as device_code
    from peak_tune.backends import _cuda_worker as worker
    from peak_tune.backends.wire import Timing, spec_from_wire

    cp = device_code.cupy_module()
    state = device_code.state
    spec, dtype = spec_from_wire(message["spec"]), str(message["dtype"])
    size, timing = ProblemSize.of(message["size"]), Timing.of(message["config"])
    n = int(size.as_dict()["M"])
    function = worker._load_function(message["cubin"], message["entry"])
    binders = {
        "kernel": device_code.in_stream(worker._kernel_binder(function, message["launch"],
                                                              message["params"])),
        "cuBLAS": device_code.in_stream(worker._cublas_binder(spec, dtype, "gemm")[1])}
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def events(run: Any, calls: int) -> float:
        start.record(state.stream)
        for _ in range(calls):
            run()
        end.record(state.stream)
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end)) / calls

    found: dict[str, Any] = {}
    for name, bind in binders.items():
        device_code.validate(spec, size, dtype, 0, bind)
        rows = {"harness": _summary(device_code.time_then_check(
            spec, size, dtype, 1, bind, timing), n)}
        run = bind(device_code._device_problem(spec, size, dtype, 2, None))
        flushed = []
        for i in range(repeats):
            device_code._flush_l2(i)
            flushed.append(events(run, 1))
        rows["same inputs, flushed"] = _summary(flushed, n)
        rows["same inputs, back to back"] = _summary([events(run, 20) for _ in range(5)], n)
        rows["harness again"] = _summary(device_code.time_then_check(
            spec, size, dtype, 1, bind, timing), n)
        found[name] = rows
    return found


def on_cupy(dtype: str, n: int, repeats: int) -> dict[str, Any]:
    """gemmEx on plain CuPy arrays on CuPy's default stream, with the worker's handle."""
    import cupy as cp
    import numpy as np

    from peak_tune.backends import _cuda_worker

    cublas, handle = _cuda_worker._cublas()
    data_type, compute_type, scalar = _cuda_worker._CUBLAS_TYPES[dtype]
    alpha, beta = np.ones(1, scalar), np.zeros(1, scalar)
    a, b = (cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
            for _ in range(2))
    c = cp.empty((n, n), dtype=dtype)
    flush = cp.empty(256 << 20, dtype=cp.uint8)

    def call() -> None:
        cublas.gemmEx(handle, 0, 0, n, n, n, alpha.ctypes.data, b.data.ptr, data_type, n,
                      a.data.ptr, data_type, n, beta.ctypes.data, c.data.ptr, data_type, n,
                      compute_type, -1)

    start, end = cp.cuda.Event(), cp.cuda.Event()
    call()
    time.sleep(IDLE_S)
    flushed = []
    for i in range(repeats):
        flush.fill(i % 256)
        start.record()
        call()
        end.record()
        end.synchronize()
        flushed.append(float(cp.cuda.get_elapsed_time(start, end)))
    back_to_back = []
    for _ in range(5):
        start.record()
        for _ in range(20):
            call()
        end.record()
        end.synchronize()
        back_to_back.append(float(cp.cuda.get_elapsed_time(start, end)) / 20)
    found = {"cupy flushed": _summary(flushed, n),
             "cupy back to back": _summary(back_to_back, n)}
    found.update(_harness_parts(dtype, n, repeats, a, b, c, call))
    return found


def _harness_parts(dtype: str, n: int, repeats: int, a: Any, b: Any, c: Any,
                   call: Any) -> dict[str, Any]:
    """`cupy flushed` with one part of the harness's way at a time: its inputs copied
    into the arrays, its stream (non-blocking), its L2 flush (memsetAsync), its buffers
    (one fenced problem, the arrays' data copied in)."""
    import cupy as cp

    from peak_tune.backends import _cuda_device as device_code
    from peak_tune.backends import _cuda_worker as worker

    device_code.cupy_module()
    state, spec = device_code.state, load_spec(SPEC)
    size = ProblemSize.of({"M": n, "N": n, "K": n})
    problem = device_code._device_problem(spec, size, dtype, 2, None)
    flush = cp.empty(256 << 20, dtype=cp.uint8)

    def timed(run: Any, stream: Any, harness_flush: bool) -> dict[str, Any]:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        samples = []
        for i in range(repeats):
            if harness_flush:
                device_code._flush_l2(i)
            else:
                with stream:
                    flush.fill(i % 256)
            start.record(stream)
            with stream:
                run()
            end.record(stream)
            end.synchronize()
            samples.append(float(cp.cuda.get_elapsed_time(start, end)))
        return _summary(samples, n)

    null = cp.cuda.Stream.null
    saved = a.copy(), b.copy()
    rows = {"cupy flushed, our stream": timed(call, state.stream, False),
            "cupy flushed, memsetAsync flush": timed(call, state.stream, True)}
    a[...] = problem.inner["A"].reshape(n, n)
    b[...] = problem.inner["B"].reshape(n, n)
    rows["cupy flushed, harness inputs"] = timed(call, null, False)
    a[...], b[...] = saved
    problem.inner["A"][...] = a.reshape(-1)
    problem.inner["B"][...] = b.reshape(-1)
    run = worker._cublas_binder(spec, dtype, "gemm")[1](problem)
    rows["harness buffers, cupy data"] = timed(run, null, False)
    rows["harness buffers, cupy data, our stream"] = timed(run, state.stream, True)
    return rows


def on_torch(dtype: str, n: int, repeats: int) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    a, b = (torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.matmul(a, b)
    torch.cuda.synchronize()
    time.sleep(IDLE_S)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        samples.append(float(start.elapsed_time(end)))
    return _summary(samples, n)


def _inner(args: argparse.Namespace) -> int:
    if args.inner == "controlled":
        print(json.dumps(controlled(json.loads(Path(args.message).read_text()), args.repeats)))
        return 0
    dtype, n = args.inner_config.split(":")
    print(json.dumps(in_process(dtype, int(n), args.repeats, args.inner)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="float16:4096,float32:4096,float16:8192")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kernels", action="store_true",
                        help="also a wgmma kernel and cuBLAS timed side by side three ways")
    parser.add_argument("--inner", choices=(*WAYS, "controlled"), help=argparse.SUPPRESS)
    parser.add_argument("--message", help=argparse.SUPPRESS)
    parser.add_argument("--inner-config", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "vendor_timing.json"))
    args = parser.parse_args()
    if args.inner:
        return _inner(args)
    found: dict[str, Any] = {"command": " ".join(sys.argv), "rows": {}}
    for config in args.configs.split(","):
        dtype, n_text = config.split(":")
        n = int(n_text)
        rows: dict[str, Any] = {"worker": through_worker(dtype, n, args.repeats)}
        for way in WAYS:
            done = subprocess.run([sys.executable, __file__, "--inner", way, "--inner-config",
                                   config, "--repeats", str(args.repeats)],
                                  capture_output=True, text=True, check=False)
            rows[way] = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0
                         else {"error": done.stderr.strip()[-400:]})
        rows.update(on_cupy(dtype, n, args.repeats))
        rows["torch"] = on_torch(dtype, n, args.repeats)
        found["rows"][config] = rows
        if args.kernels and dtype == "float16":
            for label, message in kernel_messages(dtype, n, args.repeats).items():
                path = Path(message["cubin"]).with_suffix(".json")
                path.write_text(json.dumps(message))
                done = subprocess.run([sys.executable, __file__, "--inner", "controlled",
                                       "--message", str(path), "--repeats",
                                       str(args.repeats)],
                                      capture_output=True, text=True, check=False)
                if done.returncode:
                    print(f"{config:14} {label}: {done.stderr.strip()[-400:]}", flush=True)
                    continue
                timed = json.loads(done.stdout.strip().splitlines()[-1])
                found["rows"][f"{config} {label}"] = timed
                for name, ways in timed.items():
                    for way, row in ways.items():
                        print(f"{config:14} {label[22:]:10} {name:7} {way:26} "
                              f"{row['tflops']:7.1f} TFLOP/s  ({row['min_ms']:.4f}-"
                              f"{row['max_ms']:.4f} ms)", flush=True)
                ratio = {way: timed["kernel"][way]["tflops"] / timed["cuBLAS"][way]["tflops"]
                         for way in timed["kernel"]}
                print(f"{config:14} {label[22:]:10} kernel / cuBLAS: " + ", ".join(
                    f"{way} {value:.3f}" for way, value in ratio.items()), flush=True)
        for way, row in rows.items():
            text = ("not installed" if row is None else row.get("error") or
                    f"{row['tflops']:7.1f} TFLOP/s  median {row['median_ms']:.4f} ms  "
                    f"({row['min_ms']:.4f}-{row['max_ms']:.4f}, {row['samples']} runs)")
            print(f"{config:14} {way:18} {text}", flush=True)
    Path(args.out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
