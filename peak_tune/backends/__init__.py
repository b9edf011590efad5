"""Backend drivers by name. A new backend is one module plus one line here."""

from __future__ import annotations

import importlib

from peak_tune.backends.base import Backend, Capabilities
from peak_tune.catalog.types import DeviceProfile
from peak_tune.errors import UserError

__all__ = ["BACKENDS", "capabilities", "make_backend"]

# name -> "module:Class"; imported only when chosen (GPU stacks are heavy and optional).
BACKENDS: dict[str, str] = {
    "c": "peak_tune.backends.c:CBackend",
    "cuda": "peak_tune.backends.cuda:CudaBackend",
}


def _backend_class(name: str) -> type:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})")
    module_name, class_name = BACKENDS[name].split(":")
    found: type = getattr(importlib.import_module(module_name), class_name)
    return found


def capabilities(name: str) -> Capabilities:
    """What backend `name` declares (its class attribute; no device is touched)."""
    declared: Capabilities = _backend_class(name).capabilities  # type: ignore[attr-defined]
    return declared


def make_backend(name: str, device: DeviceProfile) -> Backend:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})")
    if device.backend != name:
        raise UserError(
            f"device {device.name!r} is driven by the {device.backend!r} backend, not {name!r}"
        )
    backend: Backend = _backend_class(name)(device)
    return backend
