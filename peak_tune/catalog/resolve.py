"""Find catalogs: the built-in one (checkout or installed wheel) plus users' folders.

A catalog folder holds any of `transforms/`, `seeds/` and `devices/` (or
`backends/devices/`); a folder with transformation files (*.md) at its top counts as a
`transforms/` folder. Users' folders come after the built-in one and override by id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from peak_tune.catalog.loaders import load_devices, load_spec, load_transformations
from peak_tune.catalog.types import DTYPES, DeviceProfile, Transformation
from peak_tune.core import KernelSpec
from peak_tune.errors import UserError

__all__ = ["Catalog", "builtin_root"]


log = logging.getLogger(__name__)


def builtin_root() -> Path:
    """The checkout's root when running from one, else the wheel's bundled copy."""
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent
    if (checkout / "transforms").is_dir() and (checkout / "seeds").is_dir():
        return checkout
    bundled = package / "_catalog"
    if (bundled / "seeds").is_dir():
        return bundled
    raise UserError(f"peak-tune's built-in catalog is missing (looked in {checkout} and {bundled})")


def unused_checkout(builtin: Path, here: Path, user_roots: list[Path]) -> str | None:
    """A warning when `here` (the working folder) is a catalog checkout that is neither
    the built-in catalog in use (an installed copy) nor a --catalog folder: its edits to
    transforms/ would otherwise have no effect without a word."""
    if not ((here / "transforms").is_dir() and (here / "seeds").is_dir()):
        return None
    if here.resolve() in {builtin.resolve(), *(r.resolve() for r in user_roots)}:
        return None
    if _catalog_files(here) == _catalog_files(builtin):
        return None  # the same files: nothing edited here goes unseen
    return (f"the catalog in use is the installed copy in {builtin}, not this folder's "
            f"transforms/ and seeds/, which differ from it: `pip install -e .` here, or "
            f"pass --catalog .")


def _catalog_files(root: Path) -> dict[str, bytes]:
    """The catalog's files under `root` (transformations, seeds), by relative path."""
    return {str(p.relative_to(root)): p.read_bytes()
            for folder in ("transforms", "seeds") if (root / folder).is_dir()
            for p in sorted((root / folder).rglob("*")) if p.is_file()}


def _existing(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.is_dir()]


@dataclass(frozen=True)
class Catalog:
    """The catalog folders in force; loads lazily and checks every file it loads."""

    roots: tuple[Path, ...]

    @classmethod
    def with_user_folders(cls, folders: list[str] | tuple[str, ...] = ()) -> Catalog:
        roots = [builtin_root()]
        for folder in folders:
            path = Path(folder).expanduser()
            if not path.is_dir():
                raise UserError(f"catalog folder {folder!r} does not exist")
            roots.append(path.resolve())
        warning = unused_checkout(roots[0], Path.cwd(), roots[1:])
        if warning:
            log.warning(warning)
        catalog = cls(tuple(roots))
        catalog.check_user_kernels()
        return catalog

    def check_user_kernels(self) -> None:
        """Every kernel spec in a user's folder loads, the one tuned or not: a malformed
        one is a CatalogError naming its file, not a kernel that quietly is not there."""
        for root in self.roots[1:]:
            for spec in sorted((root / "seeds").glob("*/spec.toml")):
                load_spec(spec.parent)

    def _folders(self, *names: str) -> list[Path]:
        return _existing([root / name for root in self.roots for name in names])

    @cached_property
    def transformations(self) -> dict[str, Transformation]:
        folders = self._folders("transforms")
        folders += [r for r in self.roots[1:] if any(r.glob("*.md")) and r not in folders]
        return load_transformations(folders)

    @cached_property
    def devices(self) -> dict[str, DeviceProfile]:
        return load_devices(self._folders("devices", "backends/devices"))

    @cached_property
    def kernels(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for seeds in self._folders("seeds"):
            for spec in sorted(seeds.glob("*/spec.toml")):
                found[spec.parent.name] = spec.parent
        return found

    def spec(self, kernel: str) -> KernelSpec:
        if kernel not in self.kernels:
            known = ", ".join(sorted(self.kernels)) or "none"
            raise UserError(f"unknown kernel {kernel!r} (known: {known})")
        return load_spec(self.kernels[kernel])

    def device(self, name: str) -> DeviceProfile:
        if name not in self.devices:
            known = ", ".join(sorted(self.devices)) or "none"
            raise UserError(f"unknown device {name!r} (known: {known})")
        return self.devices[name]

    def transformation(self, tid: str) -> Transformation:
        if tid not in self.transformations:
            raise UserError(f"unknown transformation {tid!r} (see `peak-tune transforms list`)")
        return self.transformations[tid]

    def element_types(self, tid: str) -> tuple[str, ...]:
        """The element types a transformation and every one it requires apply to."""
        stack, allowed = [tid], set(DTYPES)
        while stack:
            t = self.transformation(stack.pop())
            allowed &= set(t.dtypes or DTYPES)
            stack.extend(t.requires)
        return tuple(sorted(allowed))

    def transformations_for(self, kernel: str, backend: str, dtype: str | None = None,
                            vendor: str | None = None) -> list[Transformation]:
        """The transformations for a kernel and backend (and element type and device
        maker: one that requires a transformation left out for them is left out too)."""
        kept = {t.id: t for t in self.transformations.values()
                if t.applies_to(kernel, backend, dtype, vendor)}
        while True:
            reachable = {tid: t for tid, t in kept.items()
                         if all(r in kept for r in t.requires)}
            if len(reachable) == len(kept):
                return sorted(kept.values(), key=lambda t: t.id)
            kept = reachable
