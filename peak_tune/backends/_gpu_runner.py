"""The device runtime the GPU backends share: one worker process that validates and
times kernels (and the vendor library), checked against the device profile when it
starts. CUDA and HIP use peak_tune.backends._cuda_worker (CuPy on CUDA or, in CuPy's ROCm
build, on HIP); HLSL uses peak_tune.backends._hlsl_worker (Vulkan).

A backend brings its toolchain (what it compiles to: a cubin, an AMD code object) and
the request for one evaluation; the runner starts the worker, says in one line why it
cannot (no GPU, no CuPy, another GPU than the profile's), sends one request at a time
(the timer and an LLM applier's result check share it), replaces the worker after a
fault, and rejects speeds the device cannot reach.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from peak_tune.backends._cuda_launch import check_launch
from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.backends.wire import config_to_wire, measurement_from_reply, spec_to_wire
from peak_tune.backends.worker import WorkerProcess
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelSpec, Measurement, ProblemSize, VendorCall, vendor_call
from peak_tune.errors import (
    BackendUnavailable,
    KernelCrash,
    KernelTimeout,
    NoVendorLibrary,
    WrongResult,
)
from peak_tune.evaluation.validation import applicable_sizes, require_size_constraints, size_label

__all__ = ["WORKER_MODULE", "DeviceCheck", "GpuRunner", "evaluation_message"]

_log = logging.getLogger(__name__)

WORKER_MODULE = "peak_tune.backends._cuda_worker"
_STARTUP_TIMEOUT_S = 120.0  # a fresh worker: Python, CuPy, the GPU context
_SPEED_MARGIN = 1.1  # above this multiple of the device peak, a timing is impossible

# Raises BackendUnavailable when the worker's device (its "info" reply) is not the
# profile's: another architecture, or another platform.
DeviceCheck = Callable[[Mapping[str, Any]], None]


def evaluation_message(artifact: Artifact, request: EvalRequest,
                       size: ProblemSize) -> dict[str, Any]:
    """The worker's "evaluate" request: the compiled kernel ("cubin": a cubin or a code
    object), its launch and parameters, the sizes to check and the timing."""
    context, params = request.context, request.params
    check_launch(context.launch, set(request.spec.size_symbols) | set(params))
    require_size_constraints(context, params, size)
    return {
        "op": "evaluate",
        "cubin": artifact.path,
        "entry": context.entry,
        "launch": dict(context.launch),
        "params": dict(params),
        "spec": spec_to_wire(request.spec),
        "dtype": request.dtype,
        "size": size.as_dict(),
        "check_sizes": [s.as_dict() for s in
                        applicable_sizes(context, params, request.check_sizes)],
        "config": config_to_wire(request.config),
    }


class GpuRunner:
    """One device worker for one backend instance (device 0 of what the runtime shows)."""

    def __init__(self, profile: DeviceProfile, unavailable: str, check_device: DeviceCheck,
                 worker_module: str = WORKER_MODULE, package: str = "cupy") -> None:
        """`unavailable`: the line for a missing device or `package` (what the worker
        imports), with "{reason}" in it."""
        self._profile = profile
        self._unavailable = unavailable
        self._check_device = check_device
        self._package = package
        self._device: dict[str, Any] | None = None
        self.worker = WorkerProcess(worker_module)
        self._calls = threading.RLock()

    def info(self) -> dict[str, Any]:
        """The worker's device, once it is found and is the profile's."""
        if self._device is None:
            if importlib.util.find_spec(self._package) is None:
                raise BackendUnavailable(self._unavailable.format(
                    reason=f"{self._package} is not installed"))
            info = self._start()
            try:
                self._check_device(info)
            except BackendUnavailable:
                self.worker.stop()
                raise
            self._device = info
            _log.info("GPU worker: %s (%s), driver %s", info["name"], info.get("arch", ""),
                      info["driver"])
        return self._device

    def _start(self) -> dict[str, Any]:
        """A fresh worker with its GPU context up, so kernel deadlines time kernels only."""
        try:
            self.worker.start()
            info = self.worker.call({"op": "info"}, _STARTUP_TIMEOUT_S)
        except (KernelCrash, KernelTimeout) as exc:
            self.worker.stop()
            raise BackendUnavailable(self._unavailable.format(reason=str(exc))) from exc
        if not info.get("available"):
            self.worker.stop()
            raise BackendUnavailable(self._unavailable.format(reason=info.get("reason", "?")))
        return info

    def call(self, message: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """One request at a time; a worker that died after a fault is started again."""
        with self._calls:
            if not self.worker.running:
                self._start()
            return self.worker.call(message, timeout_s)

    def evaluate(self, message: Mapping[str, Any], request: EvalRequest) -> Measurement:
        """Send an "evaluate" request the backend built; its measurement."""
        self.info()
        reply = self.call(message, request.config.timeout_s)
        measurement = measurement_from_reply(request.spec, request.size, reply)
        self.reject_impossible_speed(request.spec, request.dtype, request.size, measurement)
        return measurement

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig, backend: str) -> tuple[str, Measurement]:
        """The vendor's GEMM (cuBLAS, hipBLAS) the spec declares for `backend`, checked and
        timed like a variant (CUDA's worker); NoVendorLibrary where it declares none."""
        call = vendor_call(spec, backend)
        if call not in (VendorCall.GEMM, VendorCall.GEMM_BT):
            raise NoVendorLibrary(f"kernel {spec.name!r} declares no vendor call on "
                                  f"{backend} ([vendor] {backend} = \"gemm\" or "
                                  "\"gemm-bt\" would time cuBLAS or hipBLAS)")
        self.info()
        message = {"op": "vendor", "spec": spec_to_wire(spec), "dtype": dtype,
                   "size": size.as_dict(), "config": config_to_wire(config),
                   "call": call.value}
        reply = self.call(message, config.timeout_s)
        return str(reply["name"]), measurement_from_reply(spec, size, reply)

    def reject_impossible_speed(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                                measurement: Measurement) -> None:
        peak = float(self._profile.peak_gflops.get(dtype, 0.0))
        if peak > 0 and measurement.gflops > _SPEED_MARGIN * peak:
            raise WrongResult(
                f"impossible speed at {size_label(spec, size)}: {measurement.gflops:.1f} "
                f"GFLOP/s is above {_SPEED_MARGIN:g} x the device peak ({peak:g} GFLOP/s)")

    def close(self) -> None:
        self.worker.stop()
