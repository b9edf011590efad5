"""Backend drivers by name. A new backend is one module plus one line here."""

from __future__ import annotations

import importlib

from peak_tune.backends._compiler import first_error
from peak_tune.backends.base import Backend, Capabilities
from peak_tune.catalog.types import DeviceProfile
from peak_tune.errors import UserError

__all__ = ["BACKENDS", "FOREIGN_DEVICES", "build_description", "capabilities", "element_macros",
           "first_error", "make_backend"]

# name -> "module:Class"; imported only when chosen (GPU stacks are heavy and optional).
BACKENDS: dict[str, str] = {
    "c": "peak_tune.backends.c:CBackend",
    "cuda": "peak_tune.backends.cuda:CudaBackend",
    "hip": "peak_tune.backends.hip:HipBackend",
    "hlsl": "peak_tune.backends.hlsl:HlslBackend",
}
# (backend, the device profile's own backend) -> the class that drives such a device
# with another backend's sources: HIP on NVIDIA GPUs, HLSL through Vulkan on them.
FOREIGN_DEVICES: dict[tuple[str, str], str] = {
    ("hip", "cuda"): "peak_tune.backends.hip:HipOnCudaBackend",
    ("hlsl", "cuda"): "peak_tune.backends.hlsl:HlslOnCudaBackend",
}


def _backend_class(name: str, device_backend: str | None = None) -> type:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})")
    where = BACKENDS[name]
    if device_backend not in (None, name):
        where = FOREIGN_DEVICES[(name, device_backend)]
    module_name, class_name = where.split(":")
    found: type = getattr(importlib.import_module(module_name), class_name)
    return found


def capabilities(name: str, device_backend: str | None = None) -> Capabilities:
    """What backend `name` declares for devices of `device_backend` (default: its own);
    the class attribute, no device is touched."""
    declared: Capabilities = _backend_class(  # type: ignore[attr-defined]
        name, device_backend).capabilities
    return declared


def element_macros(name: str, dtype: str) -> dict[str, str]:
    """The macros backend `name` defines for a build of `dtype` besides the tuning
    values (the element type, the accumulator): an exported kernel sets them itself."""
    found: dict[str, str] = _backend_class(name).element_macros(dtype)  # type: ignore[attr-defined]
    return found


def build_description(name: str, dtype: str) -> str:
    """How backend `name` builds a variant of `dtype`, in one line for a person or a
    model: its compiler and flags, then the macros it defines."""
    command: str = _backend_class(name).build_command  # type: ignore[attr-defined]
    macros = " ".join(f"-D{k}={v}" for k, v in element_macros(name, dtype).items())
    return f"{command} {macros} -D<NAME>=<value> for each tuning parameter".replace("  ", " ")


def make_backend(name: str, device: DeviceProfile) -> Backend:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})")
    if device.backend != name and (name, device.backend) not in FOREIGN_DEVICES:
        raise UserError(
            f"device {device.name!r} is driven by the {device.backend!r} backend, not {name!r}"
        )
    backend: Backend = _backend_class(name, device.backend)(device)
    return backend
