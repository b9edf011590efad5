"""The backend of a study run on a Ray cluster (`--ray-address`), as its driver sees it.

The driver needs no device of its own, nor the backend's toolchain: a laptop can tune
on a cluster's MI250s. The device is probed by a Ray task on a node that has one of the
profile's kind (Ray resources by device kind: executors.ray.device_options), and what
the driver itself asks of the backend beside the trials (the vendor's timings through the
run, the end-of-run re-timing of the best, an LLM applier's checks) runs on the first
device worker of the run's RayExecutor (`attach`), one timing at a time with its trials.
Where the cluster has no device of the kind, construction says so in one line, before
anything is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peak_tune.backends import capabilities
from peak_tune.backends.base import Artifact, Capabilities, EvalConfig, EvalRequest
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import BackendUnavailable, KernelCrash
from peak_tune.executors.ray import (
    RayExecutor,
    RaySettings,
    device_options,
    import_ray,
    init_ray,
    probe_device,
    require_devices,
)

__all__ = ["ClusterBackend"]

_PROBE_TIMEOUT_S = 600.0  # a node's first task: Ray's worker start, CuPy, the GPU context


class ClusterBackend:
    """Backend `backend_name` on the devices of the Ray cluster `settings` names."""

    def __init__(self, backend_name: str, profile: DeviceProfile,
                 settings: RaySettings) -> None:
        self.name = backend_name
        self.capabilities: Capabilities = capabilities(backend_name)
        self._ray = import_ray()
        self._started_ray = not self._ray.is_initialized()
        if self._started_ray:
            init_ray(self._ray, settings)
        self._where = (f"the Ray cluster at {settings.address}" if settings.address
                       else "the local Ray")
        self._executor: RayExecutor | None = None
        try:
            require_devices(self._ray, backend_name, profile, self._where)
            task = self._ray.remote(**device_options(backend_name, profile))(probe_device)
            self._device, self._fingerprint = self._ray.get(
                task.remote(backend_name, profile), timeout=_PROBE_TIMEOUT_S)
        except Exception as exc:
            self.close()
            if not isinstance(exc, self._ray.exceptions.RayError):
                raise  # require_devices' line
            # the node's own error (Ray's wrapper also subclasses it: unwrap it)
            cause = getattr(exc, "cause", None) or exc
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise BackendUnavailable(f"on {self._where}: {first}") from None

    def __enter__(self) -> ClusterBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def attach(self, executor: RayExecutor) -> None:
        """The run's executor, whose first device worker serves the driver's requests."""
        self._executor = executor

    def probe(self) -> DeviceProfile:
        return self._device

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        """Built in the first device worker's folder on its node (build_dir is the
        driver's and is not used)."""
        return self._on_device("compile_variant", context, dict(params), dtype, time_limit_s)

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        return self._on_device("evaluate_artifact", artifact, request)

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        name, measurement = self._on_device("time_vendor", spec, dtype, size, config)
        return str(name), measurement

    def _on_device(self, method: str, *args: Any) -> Any:
        if self._executor is None:
            raise BackendUnavailable("the cluster's device workers are not started yet")
        try:
            return self._executor.on_device(method, *args)
        except self._ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None  # the backend's own error: a CompileError, ...
            raise KernelCrash(f"the device worker on {self._where} was lost: "
                              f"{(str(exc).strip().splitlines() or ['?'])[0]}") from None

    def close(self) -> None:
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
