"""What a run tunes, resolved and checked before anything starts: the kernel's spec, the
device, the backend, the element type, the sizes and the transformations that apply."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from peak_tune.backends import BACKENDS
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.roofline import ELEMENT_BYTES
from peak_tune.catalog.sequences import check_sequence
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelSpec, ProblemSize, size_of
from peak_tune.errors import InvalidPoint, UserError
from peak_tune.expr import evaluate_int
from peak_tune.session.config import TuneConfig

__all__ = ["KernelTarget", "TargetError", "TuneTarget", "check_results_folder",
           "resolve_kernel_target", "resolve_target"]


@dataclass(frozen=True)
class TuneTarget:
    spec: KernelSpec
    device: DeviceProfile  # the catalog's profile (the backend's probe refines it)
    backend: str
    sizes: list[ProblemSize]
    transformations: dict[str, Transformation]


class TargetError(UserError):
    """A target that does not fit, and which of its parts ("kernel", "device",
    "backend", "dtype", "sizes[i]"): a batch file names the key it came from."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


@dataclass(frozen=True)
class KernelTarget:
    """A kernel on a device through a backend, in one element type, at its sizes."""

    spec: KernelSpec
    device: DeviceProfile  # the catalog's profile (the backend's probe refines it)
    backend: str
    dtype: str
    sizes: list[ProblemSize]


def resolve_kernel_target(catalog: Catalog, kernel: str, device: str | None,
                          backend: str | None, dtype: str,
                          sizes: Sequence[Mapping[str, int] | str] = ()) -> KernelTarget:
    """The one resolution of what is tuned, shared by a session, the workbench, MCP and
    batch files: the kernel's spec, the device (cpu when neither it nor a GPU backend is
    named), its backend (the device's unless given), the element type and the sizes (the
    spec's default when none); TargetError naming the first part that does not fit."""
    try:
        spec = catalog.spec(kernel)
    except UserError as exc:
        raise TargetError("kernel", str(exc)) from None
    try:
        profile = catalog.device(device or _default_device(catalog, backend))
    except UserError as exc:
        raise TargetError("device", str(exc)) from None
    chosen = backend or profile.backend
    if chosen not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        if backend is None:  # the device profile names a backend not built yet
            raise TargetError("device", f"device {profile.name!r} needs the {chosen!r} "
                                        f"backend, which this version does not have ({known})")
        raise TargetError("backend", f"unknown backend {chosen!r} (available: {known})")
    if dtype not in spec.dtypes:
        raise TargetError("dtype", f"dtype {dtype!r} is not offered by {spec.name} "
                                   f"(choose from {', '.join(spec.dtypes)})")
    chosen_sizes = [_size(i, given, spec.size_symbols) for i, given in enumerate(sizes)]
    return KernelTarget(spec, profile, chosen, dtype, chosen_sizes or [spec.default_size])


def _size(index: int, given: Mapping[str, int] | str, symbols: tuple[str, ...]
          ) -> ProblemSize:
    if isinstance(given, str):
        try:
            return ProblemSize.of(size_of(given, symbols))
        except ValueError as exc:
            raise TargetError(f"sizes[{index}]", str(exc)) from None
    if set(given) != set(symbols) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given.values()):
        raise TargetError(f"sizes[{index}]", f"size {dict(given)} does not name "
                                             f"{', '.join(symbols)} with positive integers")
    return ProblemSize.of({s: int(given[s]) for s in symbols})


def resolve_target(config: TuneConfig) -> TuneTarget:
    """The target of `config`; UserError naming the first thing that does not fit."""
    wanted_target, search = config.target, config.search
    catalog = Catalog.with_user_folders(wanted_target.catalogs)
    dtype = wanted_target.dtype
    found = resolve_kernel_target(catalog, wanted_target.kernel, wanted_target.device,
                                  wanted_target.backend, dtype, wanted_target.sizes)
    spec, device, backend, sizes = found.spec, found.device, found.backend, found.sizes
    transformations = {t.id: t for t in catalog.transformations_for(
        spec.name, backend, dtype, device.vendor)}
    if backend not in spec.sources:
        raise UserError(f"kernel {spec.name!r} has no seed for backend {backend!r}")
    every_type = {t.id for t in catalog.transformations_for(spec.name, backend)}
    for tid in search.sequence + search.only:
        wanted = catalog.transformations.get(tid)
        if tid in every_type and wanted is not None and wanted.vendors and \
                device.vendor not in wanted.vendors:
            raise UserError(f"transformation {tid!r} is for {', '.join(wanted.vendors)} "
                            f"devices, not {device.name} ({device.vendor or 'no GPU'})")
        if tid in every_type and tid not in transformations:
            allowed = ", ".join(catalog.element_types(tid)) or "no element type"
            raise UserError(f"transformation {tid!r} does not apply to {dtype} "
                            f"(it is for {allowed})")
        if tid not in transformations:
            raise UserError(f"unknown transformation {tid!r} for {spec.name} on "
                            f"{backend} (see `peak-tune transforms list`)")
    if search.only:
        transformations = {t: transformations[t] for t in search.only}
    _check_fixed_sequence(search.sequence, transformations)
    if config.run.replay is None:  # a replay allocates nothing
        _check_host_memory(spec, sizes, dtype)
    return TuneTarget(spec, device, backend, sizes, transformations)


def check_results_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # A probe of its own: drivers started at once must not remove each other's.
        handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"results folder {str(folder)!r} is not writable: {exc.strerror}") from exc


def _check_fixed_sequence(sequence: tuple[str, ...],
                          transformations: Mapping[str, Transformation]) -> None:
    try:
        check_sequence(sequence, transformations)
    except InvalidPoint as exc:
        raise UserError(f"--sequence {','.join(sequence)}: {exc}") from None


def _check_host_memory(spec: KernelSpec, sizes: list[ProblemSize], dtype: str) -> None:
    """A size whose buffers alone need more memory than this host has is refused before
    anything starts (the harness holds them, and a float64 reference, in host memory)."""
    have = _host_memory_bytes()
    element = ELEMENT_BYTES.get(dtype, 4)
    buffers = [a for a in spec.args if a.kind == "buffer"]
    for size in sizes:
        values = size.as_dict()
        need = sum(element * math.prod(evaluate_int(e, values) for e in a.shape)
                   for a in buffers)
        if have and need > have:
            raise UserError(
                f"size {size.label()} needs at least {need / 1e9:.1f} GB of host memory for "
                f"its buffers ({', '.join(a.name for a in buffers)} in {dtype}), and this "
                f"machine has {have / 1e9:.1f} GB: choose a smaller --size")


def _host_memory_bytes() -> int:
    """This machine's memory, or its container's limit if lower (0: unknown)."""
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        have = 0
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    return min(have, int(limit)) if limit.isdigit() and have else have


def _default_device(catalog: Catalog, backend: str | None) -> str:
    """cpu without a backend or with c; otherwise the user must say which device."""
    if backend in (None, "c"):
        return "cpu"
    choices = sorted(d.name for d in catalog.devices.values() if d.backend == backend)
    if not choices:
        return "cpu"  # the backend check that follows names the problem
    raise UserError(f"--backend {backend} needs --device (one of {', '.join(choices)})")
