"""The GPU evaluation worker of the CUDA and HIP backends (a child process; see
peak_tune.backends.worker).

`python -m peak_tune.backends._cuda_worker --request-fd R --response-fd W` owns the
process's GPU context through CuPy, which runs on CUDA or, in its ROCm build, on HIP: it
loads the compiled kernel (a cubin, or an AMD code object from clang), validates it
against the float64 reference (kept on the device per seed: peak_tune.backends.
_cuda_check) and times it with the runtime's events (peak_tune.backends._cuda_device);
the vendor baseline, cuBLAS or, on ROCm, hipBLAS, runs here too, through the same code.
A fault that corrupts the context (illegal address, trap) is reported as a KernelCrash
and the parent replaces this process; a hang is killed there. `--one-shot FILE`
validates one request once and exits (run under compute-sanitizer).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from peak_tune.backends._cuda_device import (
    Binder,
    Call,
    DeviceFault,
    DeviceProblem,
    cupy_module,
    device_errors,
    in_stream,
    phases_ms,
    state,
    time_then_check,
    validate,
)
from peak_tune.backends._cuda_launch import evaluate_launch, geometry_fits, tensor_map_boxes
from peak_tune.backends._worker_child import serve
from peak_tune.backends.wire import Timing, spec_from_wire
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import CompileError, NoVendorLibrary, UserError, WrongResult

_log = logging.getLogger(__name__)

_MAX_MODULES = 32  # loaded cubins kept; the oldest is unloaded beyond this
_CUBLAS_TYPES = {"float32": (0, 68, np.float32), "float16": (2, 68, np.float32),
                 "bfloat16": (14, 68, np.float32),
                 "float64": (1, 70, np.float64)}  # cudaDataType, cublasComputeType, scalars
_CUBLAS_COMPUTE = {"float32": "fp32 in/out, CUBLAS_COMPUTE_32F (true SGEMM, TF32 off)",
                   "float16": "fp16 in/out, fp32 accumulation (CUBLAS_COMPUTE_32F)",
                   "bfloat16": "bf16 in/out, fp32 accumulation (CUBLAS_COMPUTE_32F)",
                   "float64": "fp64 in/out, CUBLAS_COMPUTE_64F"}
# On ROCm, CuPy's gemmEx is hipblasGemmEx, whose compute type is a data type (the
# accumulator's: fp32 for fp16 inputs) and whose algorithm must be the default.
_HIPBLAS_COMPUTE_TYPES = {"float32": 0, "float16": 0, "float64": 1}
_HIPBLAS_COMPUTE = {"float32": "fp32 in/out, fp32 compute",
                    "float16": "fp16 in/out, fp32 compute",
                    "float64": "fp64 in/out, fp64 compute"}
_AMDGPU_VERSION = Path("/sys/module/amdgpu/version")
_WRONG_RESULT_STATUS = 3  # --one-shot's exit status for a wrong result

Handler = Callable[[dict[str, Any]], dict[str, Any]]

_modules: OrderedDict[str, Any] = OrderedDict()
_cublas_handle: list[tuple[Any, Any]] = []  # (cupy's cublas module, our handle), once


def _tainting(handler: Handler) -> Handler:
    """Any CUDA error a handler lets through also ends this process (context suspect)."""

    def run(request: dict[str, Any]) -> dict[str, Any]:
        try:
            return handler(request)
        except device_errors() as exc:
            raise DeviceFault(f"kernel crashed: {exc}") from None

    return run


# ---------------------------------------------------------------- device info


def _driver_version(hip: bool) -> str:
    """The kernel driver's version: NVIDIA's module, or amdgpu's (ROCm's DKMS build)."""
    try:
        if hip:
            return _AMDGPU_VERSION.read_text().strip()
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return ""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return found.group(1) if found else ""


def _runtime_label(version: int, hip: bool) -> str:
    """CUDA's 12040 -> "12.4"; HIP's 60032830 (major * 10**7 + minor * 10**5 + patch)
    -> "6.0"."""
    if hip:
        return f"{version // 10_000_000}.{version // 100_000 % 100}"
    return f"{version // 1000}.{version % 1000 // 10}"


def _info(request: dict[str, Any]) -> dict[str, Any]:
    """What the parent's probe needs; {"available": False, "reason": ...} without a GPU.
    "platform" is "hip" under CuPy's ROCm build, with the GPU's gfx target as "arch"."""
    try:
        import cupy
    except Exception as exc:
        return {"available": False, "reason": f"cupy cannot be imported: {exc}"}
    hip = bool(getattr(cupy.cuda.runtime, "is_hip", False))
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            return {"available": False,
                    "reason": f"no {'HIP' if hip else 'CUDA'} device is visible"}
        props = cupy.cuda.runtime.getDeviceProperties(0)
        driver_api = cupy.cuda.runtime.driverGetVersion()
        runtime_api = cupy.cuda.runtime.runtimeGetVersion()
        cupy_module()
    except Exception as exc:
        return {"available": False, "reason": str(exc).splitlines()[0]}
    name = _text(props["name"])
    arch = _text(props.get("gcnArchName", b"")).split(":")[0] if hip else ""
    return {
        "available": True,
        "platform": "hip" if hip else "cuda",
        "name": name,
        "arch": arch or f"sm_{props['major']}{props['minor']}",
        "compute_capability": f"{props['major']}{props['minor']}",
        "driver": _driver_version(hip),
        "driver_cuda": _runtime_label(driver_api, hip),
        "runtime_cuda": _runtime_label(runtime_api, hip),
        "cupy": cupy.__version__,
        "sms": int(props["multiProcessorCount"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "shared_optin_bytes": int(props.get("sharedMemPerBlockOptin")
                                  or props["sharedMemPerBlock"]),
        "memory_bytes": int(props["totalGlobalMem"]),
    }


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _on_hip() -> bool:
    return bool(getattr(cupy_module().cuda.runtime, "is_hip", False))


# ---------------------------------------------------------------- kernels


def _load_function(cubin: str, entry: str) -> Any:
    cp = cupy_module()
    module = _modules.get(cubin)
    try:
        if module is None:
            module = cp.RawModule(path=cubin)
        function = module.get_function(entry)
        int(function.num_regs)  # loads the module now: a bad cubin fails here
    except device_errors() as exc:
        raise CompileError(f"cannot load the compiled kernel {entry!r}: {exc}") from None
    _modules[cubin] = module
    _modules.move_to_end(cubin)
    while len(_modules) > _MAX_MODULES:
        _modules.popitem(last=False)
    return function


def _attributes(function: Any) -> dict[str, int]:
    return {
        "registers": int(function.num_regs),
        "shared_static_bytes": int(function.shared_size_bytes),
        "local_bytes": int(function.local_size_bytes),
        "max_threads_per_block": int(function.max_threads_per_block),
    }


def _kernel_binder(
    function: Any, launch: Mapping[str, str], params: Mapping[str, int]
) -> Binder:
    attributes = _attributes(function)

    def bind(device: DeviceProblem) -> Call:
        names = {**device.size.as_dict(), **params, "SMS": state.multiprocessors}
        geometry = evaluate_launch(launch, names)
        geometry_fits(geometry, attributes["max_threads_per_block"],
                      attributes["shared_static_bytes"], state.shared_limit)
        # CUDA needs an opt-in past 48 KiB; HIP lets a block have all its LDS (64 KiB)
        if not _on_hip() and geometry.shared_bytes > function.max_dynamic_shared_size_bytes:
            function.max_dynamic_shared_size_bytes = geometry.shared_bytes
        buffers = [arg.name for arg in device.reference.spec.args if arg.kind == "buffer"]
        maps = tuple(device.tensor_map(box)
                     for box in tensor_map_boxes(launch, names, buffers))
        args = device.kernel_args() + maps  # maps after the spec's arguments

        def run() -> None:
            function(geometry.grid, geometry.block, args, shared_mem=geometry.shared_bytes)

        return run

    return bind


def _evaluate(request: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_wire(request["spec"])
    dtype = str(request["dtype"])
    size = ProblemSize.of(request["size"])
    timing = Timing.of(request["config"])
    phases_ms.clear()
    function = _load_function(request["cubin"], request["entry"])
    bind = in_stream(_kernel_binder(function, request["launch"], request["params"]))
    seed = timing.seed
    checks = [ProblemSize.of(s) for s in request["check_sizes"]]
    for check in checks:
        validate(spec, check, dtype, seed, bind)
        seed += 1
    # at `size`: validated, then timed and checked again at the next seed
    validated_ms = validate(spec, size, dtype, seed, bind)
    samples_ms = time_then_check(spec, size, dtype, seed + 1, bind, timing, validated_ms)
    return {"samples_ms": samples_ms, "resources": _attributes(function),
            "phases_ms": dict(phases_ms)}


# ---------------------------------------------------------------- vendor: cuBLAS


def _cublas() -> tuple[Any, Any]:
    """A cuBLAS handle of our own, default math mode (no TF32 for fp32 GEMMs)."""
    if not _cublas_handle:
        cp = cupy_module()
        try:
            from cupy_backends.cuda.libs import cublas
        except ImportError:
            cublas = cp.cuda.cublas

        handle = cublas.create()
        if not _on_hip():  # hipBLAS has no TF32 mode to keep off
            cublas.setMathMode(handle, 0)  # CUBLAS_DEFAULT_MATH
        _cublas_handle.append((cublas, handle))
    return _cublas_handle[0]


def _cublas_binder(spec: KernelSpec, dtype: str, call: str) -> tuple[str, Binder]:
    """cuBLAS (hipBLAS on ROCm) gemmEx for the spec's declared GEMM (the loader checked
    its shapes: A [.., M, K], B [.., K, N] or [.., N, K], C [.., M, N]); strided batched
    when the buffers carry a batch."""
    if dtype not in _CUBLAS_TYPES:
        raise UserError(f"no cuBLAS baseline for {dtype}")
    if call not in ("gemm", "gemm-bt"):
        raise NoVendorLibrary(f"no GEMM declared for {spec.name!r}")
    ins = [a for a in spec.args if a.kind == "buffer" and a.intent == "in"]
    outs = [a for a in spec.args if a.kind == "buffer" and a.intent != "in"]
    transposed = call == "gemm-bt"
    cublas, handle = _cublas()
    data_type, compute_type, scalar = _CUBLAS_TYPES[dtype]
    alpha, beta = np.ones(1, scalar), np.zeros(1, scalar)
    if _on_hip():
        if dtype not in _HIPBLAS_COMPUTE_TYPES:
            raise UserError(f"no hipBLAS baseline for {dtype} in this version")
        compute_type = _HIPBLAS_COMPUTE_TYPES[dtype]
        library = f"hipBLAS gemmEx ({_HIPBLAS_COMPUTE[dtype]}; CuPy {cupy_module().__version__})"
    else:
        major, rest = divmod(int(cublas.getVersion(handle)), 10000)
        library = f"cuBLAS {major}.{rest // 100}.{rest % 100} gemmEx ({_CUBLAS_COMPUTE[dtype]})"
    batched = len(ins[0].shape) == 3
    name = library + (", B transposed" if transposed else "") + (
        ", strided batched" if batched else "")

    def bind(device: DeviceProblem) -> Call:
        a_shape, b_shape = device.shape(ins[0].name), device.shape(ins[1].name)
        m, k = (int(x) for x in a_shape[-2:])
        n = int(b_shape[-2] if transposed else b_shape[-1])
        batch = int(a_shape[0]) if batched else 1
        a, b = device.pointer(ins[0].name), device.pointer(ins[1].name)
        c = device.pointer(outs[0].name)
        # row-major C = A op(B) is column-major C^T = op(B)^T A^T: B first, transposed
        # from its stored N x K (leading dimension K) for gemm-bt
        op_b, ld_b = (1, k) if transposed else (0, n)

        def run() -> None:
            if batch == 1:
                cublas.gemmEx(handle, op_b, 0, n, m, k, alpha.ctypes.data, b, data_type,
                              ld_b, a, data_type, k, beta.ctypes.data, c, data_type, n,
                              compute_type, -1)
            else:
                cublas.gemmStridedBatchedEx(
                    handle, op_b, 0, n, m, k, alpha.ctypes.data, b, data_type, ld_b, n * k,
                    a, data_type, k, m * k, beta.ctypes.data, c, data_type, n, m * n, batch,
                    compute_type, -1)

        return run

    return name, bind


def _vendor(request: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_wire(request["spec"])
    dtype = str(request["dtype"])
    size = ProblemSize.of(request["size"])
    timing = Timing.of(request["config"])
    phases_ms.clear()
    name, bind = _cublas_binder(spec, dtype, str(request.get("call", "gemm")))
    bind = in_stream(bind)
    validate(spec, size, dtype, timing.seed, bind)
    # Timed twice, the faster pass kept: on buffers fresh in this process cuBLAS ran
    # 430-520 TFLOP/s (fp16 4096, H100) where a second pass on the same mappings ran
    # 650-670 (benchmarks/vendor_timing.py); the vendor is trusted code, so keeping its
    # better pass only makes a variant's ratio harder to earn.
    passes = [time_then_check(spec, size, dtype, timing.seed + 1, bind, timing)
              for _ in range(2)]
    samples_ms = min(passes, key=lambda samples: sorted(samples)[len(samples) // 2])
    return {"name": name, "samples_ms": samples_ms, "phases_ms": dict(phases_ms)}


# ---------------------------------------------------------------- one-shot (sanitizer)


def _one_shot(path: str) -> int:
    """Validate once at each of the request's sizes; 0 if valid, 3 for a wrong result."""
    request = json.loads(Path(path).read_text())
    cp = cupy_module()
    cp.cuda.set_allocator(None)  # plain cudaMalloc: memcheck sees each buffer's bounds
    spec = spec_from_wire(request["spec"])
    function = _load_function(request["cubin"], request["entry"])
    bind = in_stream(_kernel_binder(function, request["launch"], request["params"]))
    try:
        for index, size in enumerate([*request["check_sizes"], request["size"]]):
            validate(spec, ProblemSize.of(size), str(request["dtype"]), index, bind,
                     on_host=True)
    except WrongResult as exc:
        print(f"peak-tune: {exc}", file=sys.stderr)
        return _WRONG_RESULT_STATUS
    return 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if len(sys.argv) == 3 and sys.argv[1] == "--one-shot":
        return _one_shot(sys.argv[2])
    return serve({"info": _info, "evaluate": _tainting(_evaluate),
                  "vendor": _tainting(_vendor)})


if __name__ == "__main__":
    sys.exit(main())
