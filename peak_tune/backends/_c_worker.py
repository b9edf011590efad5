"""The C backend's kernel runner (a child process; see peak_tune.backends.worker).

`python -m peak_tune.backends._c_worker --request-fd R --response-fd W` loads compiled
kernels with ctypes and runs them, or numpy's BLAS (the vendor baseline), on buffers in
the judge's shared arena (peak_tune.harness.arena), one run per `prepare` + `go`, timing
the call alone with `time.perf_counter_ns`. It judges nothing: inputs, poison, cache flushes and
every check are the judge's (peak_tune.harness.host_judge), in the tuner's process.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from peak_tune.backends._worker_child import serve
from peak_tune.backends.wire import spec_from_wire
from peak_tune.core import KernelSpec, ProblemSize, VendorCall, vendor_call
from peak_tune.errors import CompileError, UserError
from peak_tune.evaluation.validation import numpy_dtype
from peak_tune.expr import evaluate, evaluate_int
from peak_tune.harness.arena import PROT_NONE, PROT_READ, map_for_kernel, set_access
from peak_tune.harness.host_judge import layout_arrays

_log = logging.getLogger(__name__)

_C_TYPES: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
}
_INT_LIMIT = 2**31
_KEPT_ARENAS = 8

_libraries: dict[str, ctypes.CDLL] = {}
_arenas: dict[str, tuple[mmap.mmap, int]] = {}  # path -> (mapping, base address)
_inputs: dict[str, list[tuple[int, int]]] = {}  # path -> its inputs' (offset, length)

Call = Callable[[], None]


def _arena(path: str, layout: list[Mapping[str, Any]]) -> tuple[mmap.mmap, int]:
    if path not in _arenas:
        protected = [(int(o), int(n)) for b in layout for o, n in b["protected"]]
        read_only = [(int(b["read_only"][0]), int(b["read_only"][1])) for b in layout
                     if b["read_only"]]
        while len(_arenas) >= _KEPT_ARENAS:
            _arenas.pop(next(iter(_arenas)))  # unmapped once nothing refers to it
        _arenas[path] = map_for_kernel(path, protected, read_only)
        _inputs[path] = read_only
    return _arenas[path]


def _function(library: str, entry: str, spec: KernelSpec, dtype: str) -> Any:
    if dtype not in _C_TYPES:
        raise UserError(f"the C backend supports {', '.join(_C_TYPES)}, not {dtype!r}")
    if library not in _libraries:
        try:
            _libraries[library] = ctypes.CDLL(library)
        except OSError as exc:
            raise CompileError(f"cannot load the compiled kernel: {exc}") from None
    try:
        function = getattr(_libraries[library], entry)
    except AttributeError:
        raise CompileError(f"entry point {entry!r} not found in the compiled kernel") from None
    function.argtypes = [ctypes.c_void_p if a.kind == "buffer" else ctypes.c_int
                         for a in spec.args]
    function.restype = None
    return function


def _kernel_call(request: Mapping[str, Any], spec: KernelSpec, base: int) -> Call:
    function = _function(str(request["library"]), str(request["entry"]), spec,
                         str(request["dtype"]))
    addresses = {b["name"]: base + int(b["data_offset"]) for b in request["regions"]}
    sizes = ProblemSize.of(request["size"]).as_dict()
    values: list[Any] = []
    for arg in spec.args:
        if arg.kind == "buffer":
            values.append(addresses[arg.name])
            continue
        value = evaluate_int(arg.value, sizes)
        if abs(value) >= _INT_LIMIT:
            raise UserError(f"scalar {arg.name} = {value} does not fit a C int")
        values.append(value)
    return lambda: function(*values)


def _vendor_call(spec: KernelSpec, arrays: dict[str, np.ndarray],
                 sizes: Mapping[str, int]) -> Call:
    """numpy.matmul for a GEMM call (the spec's [vendor]); otherwise the reference
    expression in the target dtype."""
    inputs = [arrays[a.name] for a in spec.args if a.kind == "buffer" and a.intent == "in"]
    outputs = [arrays[a.name] for a in spec.args if a.kind == "buffer" and a.intent != "in"]
    call = vendor_call(spec, "c")
    if call in (VendorCall.GEMM, VendorCall.GEMM_BT):
        left, out = inputs[0], outputs[0]
        right = inputs[1] if call is VendorCall.GEMM else np.swapaxes(inputs[1], -1, -2)

        def run_matmul() -> None:
            np.matmul(left, right, out=out)

        return run_matmul
    scalars = {a.name: evaluate_int(a.value, sizes) for a in spec.args if a.kind == "scalar"}
    names: dict[str, Any] = {**sizes, **scalars, **arrays}

    def run_reference() -> None:
        result = evaluate(spec.reference, names)
        results = list(result) if isinstance(result, tuple | list) else [result]
        for out, value in zip(outputs, results, strict=True):
            out[...] = value

    return run_reference


_prepared: dict[str, Call] = {}  # arena -> the call `go` makes there (this job's kernel)


def _prepare(request: dict[str, Any]) -> dict[str, Any]:
    """Bind the call (kernel or vendor) to the arena's buffers; `go` makes it. Apart, so
    that the judge can write the inputs while the job is stopped and resume it only to
    make the call: no thread of the kernel's sees the inputs before the timed call."""
    spec = spec_from_wire(request["spec"])
    mapping, base = _arena(str(request["arena"]), request["regions"])
    if request["vendor"]:
        arrays = layout_arrays(mapping, request["regions"], numpy_dtype(request["dtype"]))
        call = _vendor_call(spec, arrays, ProblemSize.of(request["size"]).as_dict())
    else:
        call = _kernel_call(request, spec, base)
    _prepared[str(request["arena"])] = call
    return {}


def _go(request: dict[str, Any]) -> dict[str, Any]:
    path = str(request["arena"])
    call = _prepared.get(path)
    if call is None:
        raise UserError("no call prepared for this arena")
    base = _arenas[path][1]
    set_access(base, _inputs[path], PROT_READ)  # the inputs open for the call alone
    start = time.perf_counter_ns()
    call()
    elapsed_ns = time.perf_counter_ns() - start
    set_access(base, _inputs[path], PROT_NONE)
    return {"elapsed_ns": elapsed_ns}


def _blas(request: dict[str, Any]) -> dict[str, Any]:
    """The BLAS numpy runs on, e.g. "scipy-openblas 0.3.31" (threadpoolctl if present)."""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("user_api") == "blas":
                name = f"{info.get('internal_api', 'blas')} {info.get('version', '')}"
                return {"name": name.strip()}
    except ImportError:
        pass
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return {"name": f"{blas['name']} {blas.get('version', '')}".strip()}
    except (KeyError, TypeError, AttributeError):
        return {"name": "numpy BLAS"}


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return serve({"prepare": _prepare, "go": _go, "blas": _blas},
                 job_ops=frozenset({"prepare", "go"}))


if __name__ == "__main__":
    sys.exit(main())
