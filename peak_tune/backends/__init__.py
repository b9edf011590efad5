"""Backend drivers by name. A new backend is one module plus one line here."""

from __future__ import annotations

import importlib

from peak_tune.backends.base import Backend
from peak_tune.catalog.types import DeviceProfile
from peak_tune.errors import UserError

__all__ = ["BACKENDS", "make_backend"]

# name -> "module:Class"; imported only when chosen (GPU stacks are heavy and optional).
BACKENDS: dict[str, str] = {
    "c": "peak_tune.backends.c:CBackend",
    "cuda": "peak_tune.backends.cuda:CudaBackend",
}


def make_backend(name: str, device: DeviceProfile) -> Backend:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})")
    if device.backend != name:
        raise UserError(
            f"device {device.name!r} is driven by the {device.backend!r} backend, not {name!r}"
        )
    module_name, class_name = BACKENDS[name].split(":")
    backend: Backend = getattr(importlib.import_module(module_name), class_name)(device)
    return backend
