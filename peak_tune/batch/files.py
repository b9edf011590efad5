"""Batch files: many studies (kernels x devices x dtypes x sizes) in one TOML file.

```toml
name = "nightly"            # study name prefix (default: the file's stem)
trials = 20                 # trials each study should hold in all (finished ones count)
[matrix]                    # the product of these lists, one study per combination
kernels = ["matmul"]
devices = ["cpu"]
dtypes = ["float32", "float64"]
sizes = ["64", "128x96x64"]
[[study]]                   # and/or single studies; `sizes` here are tuned together
device = "h200"
dtype = "float16"
sizes = ["4096"]
trials = 300
```

Everything is checked before anything starts; a problem is one line naming the file and
the key. Each entry becomes a TuneConfig with a deterministic study name, so running the
same file again resumes every study by name.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peak_tune.backends import capabilities
from peak_tune.catalog.resolve import Catalog
from peak_tune.errors import UserError
from peak_tune.session.config import CHOICES, TuneConfig
from peak_tune.session.target import TargetError, resolve_kernel_target

__all__ = ["BatchError", "BatchPlan", "BatchStudy", "load_batch"]

# Settings a study takes from the top level unless its entry gives its own.
_SETTINGS: dict[str, type | tuple[type, ...]] = {
    "trials": int, "sampler": str, "applier": str, "model": str, "seed": int,
    "encoding": str, "illegal": str, "transforms": list, "sequence": list, "repeats": int,
    "timeout": (int, float), "compile_workers": int, "temperature": (int, float),
    "repairs": int, "max_tokens_total": int, "polish": (int, float),
    "build_budget": (int, float), "ray_workers": int, "in_flight": int,
}
_TOP_ONLY: dict[str, type | tuple[type, ...]] = {
    "name": str, "results": str, "storage": str, "executor": str, "ray_address": str,
    "catalogs": list,
    "matrix": dict, "study": list,
}
_MATRIX: dict[str, type | tuple[type, ...]] = {
    "kernels": list, "devices": list, "dtypes": list, "sizes": list,
}
_STUDY_ONLY: dict[str, type | tuple[type, ...]] = {
    "name": str, "kernel": str, "device": str, "dtype": str, "sizes": list,
}
_CHOICES = {k: CHOICES[k] for k in ("applier", "sampler", "encoding", "illegal")}
_LEAST: dict[str, float] = {"trials": 0, "repeats": 1, "timeout": 0.001,
                            "compile_workers": 0, "repairs": 0, "max_tokens_total": 1,
                            "polish": 0, "build_budget": 0, "ray_workers": 1,
                            "in_flight": 0}
_BELOW: dict[str, float] = {"polish": 1}
# settings that are tune options of the same name and value (session.config.OPTIONS)
_AS_OPTIONS = ("model", "seed", "sampler", "encoding", "illegal", "compile_workers",
               "ray_workers", "in_flight")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class BatchError(UserError):
    """A batch file problem: `FILE: KEY: what is wrong`, on one line."""

    def __init__(self, path: Path, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}" if key else f"{path}: {problem}")


@dataclass(frozen=True)
class BatchStudy:
    """One study of a batch: its tuning configuration and the trials it should hold."""

    name: str
    config: TuneConfig
    trials: int

    @property
    def backend(self) -> str:
        return self.config.target.backend or "c"

    @property
    def exclusive(self) -> bool:
        """Timed on the host CPU: anything else running at once would disturb it."""
        return capabilities(self.backend).on_host


@dataclass(frozen=True)
class BatchPlan:
    path: Path
    studies: tuple[BatchStudy, ...]
    storage: str | None  # None: SQLite in the results folder
    results: Path


@dataclass(frozen=True)
class _Entry:
    """One study as written: its values, and where in the file each one was written."""

    label: str  # "study[2]", or "matrix"
    values: dict[str, Any]
    keys: dict[str, str] = field(default_factory=dict)  # "device" -> "matrix.devices[1]"

    def key(self, name: str) -> str:
        """The file's key for `name`: the entry's own, or the top-level default's."""
        if name in self.keys:
            return self.keys[name]
        return f"{self.label}.{name}" if name.split("[")[0] in self.values else name


@dataclass(frozen=True)
class _Overrides:
    """What the command line says; it wins over the file."""

    results: Path | None = None
    storage: str | None = None
    applier: str = "reference"  # the default applier when the file names none


def load_batch(path: Path, results: Path | None = None, storage: str | None = None,
               default_applier: str = "reference") -> BatchPlan:
    """Read and check a batch file; nothing is opened or written."""
    return _Loader(path, _Overrides(results, storage, default_applier)).plan()


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"batch file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BatchError(path, "", f"not valid TOML: {exc}") from exc


class _Loader:
    def __init__(self, path: Path, overrides: _Overrides) -> None:
        self.path = path
        self.data = _read(path)
        self.overrides = overrides
        self.folder = path.resolve().parent

    def fail(self, key: str, problem: str) -> BatchError:
        return BatchError(self.path, key, problem)

    def check_keys(self, table: Mapping[str, Any], allowed: Mapping[str, Any],
                   where: str) -> None:
        for key, value in table.items():
            name = f"{where}.{key}" if where else key
            if key not in allowed:
                raise self.fail(name, f"unknown key (allowed: {', '.join(sorted(allowed))})")
            kind = allowed[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                wanted = kind.__name__ if isinstance(kind, type) else "number"
                raise self.fail(name, f"expected {_kind_name(wanted)}, got {value!r}")

    def plan(self) -> BatchPlan:
        self.check_keys(self.data, {**_SETTINGS, **_TOP_ONLY}, "")
        self.check_settings(self.data, "")
        self.catalog = self._catalog()
        executor = self.data.get("executor", "local")
        if executor not in CHOICES["executor"]:
            raise self.fail("executor", f"{executor!r} is not available to batch "
                                        f"(choose from {', '.join(CHOICES['executor'])})")
        results = self.overrides.results or self._path("results", "results")
        storage = self.overrides.storage or self.data.get("storage")
        entries = self._matrix_entries() + self._study_entries()
        if not entries:
            raise self.fail("", "no studies: add a [matrix] table or [[study]] entries")
        prefix = self.data.get("name", self.path.stem)
        if not _NAME.fullmatch(prefix):
            raise self.fail("name", f"{prefix!r}: use letters, digits, '.', '_' and '-'")
        studies: dict[str, BatchStudy] = {}
        for entry in entries:
            study = self._study(entry, prefix, results, storage)
            if study.name in studies:
                raise self.fail(entry.label, f"a second study named {study.name!r}")
            studies[study.name] = study
        ray_address = self.data.get("ray_address")
        if executor != "local" or ray_address:  # each study, in turn, on every device
            studies = {name: dataclasses.replace(study, config=study.config.with_options(
                executor=executor, ray_address=ray_address))
                for name, study in studies.items()}
        return BatchPlan(self.path, tuple(studies.values()), storage, results)

    def _path(self, key: str, default: str) -> Path:
        """A path from the file, relative to the file's folder; the default is the CLI's."""
        given = self.data.get(key)
        return Path(default) if given is None else self.folder / Path(given).expanduser()

    def _catalog(self) -> Catalog:
        folders = self.data.get("catalogs", [])
        for i, folder in enumerate(folders):
            if not isinstance(folder, str) or not (self.folder / folder).is_dir():
                raise self.fail(f"catalogs[{i}]", f"folder {folder!r} does not exist")
        try:
            return Catalog.with_user_folders([str(self.folder / f) for f in folders])
        except UserError as exc:
            raise self.fail("catalogs", str(exc)) from exc

    def _matrix_entries(self) -> list[_Entry]:
        matrix = self.data.get("matrix")
        if matrix is None:
            return []
        self.check_keys(matrix, _MATRIX, "matrix")
        axes = [matrix.get(k, [d]) for k, d in (("kernels", "matmul"), ("devices", "cpu"),
                                                 ("dtypes", "float32"), ("sizes", None))]
        for key, axis in zip(_MATRIX, axes, strict=True):
            if not axis:
                raise self.fail(f"matrix.{key}", "empty list")
        indexed = [list(enumerate(axis)) for axis in axes]
        return [_Entry("matrix", {"kernel": kernel, "device": device, "dtype": dtype,
                                  "sizes": [] if size is None else [size]},
                       {"kernel": f"matrix.kernels[{a}]", "device": f"matrix.devices[{b}]",
                        "dtype": f"matrix.dtypes[{c}]", "sizes[0]": f"matrix.sizes[{d}]"})
                for (a, kernel), (b, device), (c, dtype), (d, size)
                in itertools.product(*indexed)]

    def _study_entries(self) -> list[_Entry]:
        entries = self.data.get("study", [])
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise self.fail(f"study[{i}]", "expected a table ([[study]])")
            self.check_keys(entry, {**_SETTINGS, **_STUDY_ONLY}, f"study[{i}]")
            self.check_settings(entry, f"study[{i}]")
        return [_Entry(f"study[{i}]", entry) for i, entry in enumerate(entries)]

    def _study(self, entry: _Entry, prefix: str, results: Path,
               storage: str | None) -> BatchStudy:
        values = entry.values
        settings = {k: v for k, v in self.data.items() if k in _SETTINGS}
        settings.update({k: v for k, v in values.items() if k in _SETTINGS})
        kernel, device_name, dtype = (values.get("kernel", "matmul"),
                                      values.get("device", "cpu"), values.get("dtype", "float32"))
        for key, value in (("kernel", kernel), ("device", device_name), ("dtype", dtype)):
            if not isinstance(value, str):
                raise self.fail(entry.key(key), f"expected a string, got {value!r}")
        given = [self._size_text(entry.key(f"sizes[{i}]"), s)
                 for i, s in enumerate(values.get("sizes", []))]
        try:
            target = resolve_kernel_target(self.catalog, kernel, device_name, None, dtype,
                                           given)
        except TargetError as exc:
            raise self.fail(entry.key(exc.part), str(exc)) from exc
        spec, device = target.spec, target.device
        sizes = tuple(s.as_dict() for s in target.sizes) if given else ()
        label = "_".join("x".join(str(s[k]) for k in spec.size_symbols) for s in sizes)
        name = values.get("name") or "-".join(
            [prefix, spec.name, device.name, dtype, label or "default"])
        if not _NAME.fullmatch(name):
            raise self.fail(entry.key("name"), f"{name!r}: use letters, digits, '.', '_', '-'")
        config = TuneConfig.of(kernel=kernel, backend=device.backend, device=device.name,
                               dtype=dtype, sizes=sizes, study=name, results=results,
                               storage=storage, catalogs=self.catalog_folders)
        config = self._settings(entry, config, settings, spec.name)
        trials = settings.get("trials", 20)
        return BatchStudy(name, config, trials)

    @property
    def catalog_folders(self) -> tuple[str, ...]:
        return tuple(str(p) for p in self.catalog.roots[1:])

    def _size_text(self, key: str, value: Any) -> Mapping[str, int] | str:
        """A size as written (N, AxBx..., NAME=V,... or a table): a number as its text;
        what resolve_kernel_target checks against the kernel's symbols."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str | dict):
            return value
        raise self.fail(key, f"size {value!r}: use N, AxBx..., NAME=V,... or a table of "
                             "the kernel's sizes with positive integers")

    def check_settings(self, table: Mapping[str, Any], where: str) -> None:
        """Ranges and choices of the settings a table gives (types are checked already)."""
        prefix = f"{where}." if where else ""
        for key, allowed in _CHOICES.items():
            if key in table and table[key] not in allowed:
                raise self.fail(prefix + key, f"{table[key]!r} is not one of "
                                              f"{', '.join(allowed)}")
        for key, least in _LEAST.items():
            if key in table and table[key] < least:
                raise self.fail(prefix + key, f"must be at least {least}")
        for key, bound in _BELOW.items():
            if key in table and table[key] >= bound:
                raise self.fail(prefix + key, f"must be below {bound}")
        for key in ("transforms", "sequence"):
            for i, tid in enumerate(table.get(key, [])):
                if not isinstance(tid, str):
                    raise self.fail(f"{prefix}{key}[{i}]", f"expected a string, got {tid!r}")

    def _settings(self, entry: _Entry, config: TuneConfig, settings: dict[str, Any],
                  kernel: str) -> TuneConfig:
        """Apply the per-study settings to `config`, checking each choice; what the file
        leaves out keeps the default of the tune command (session.config)."""
        get = settings.get
        backend = config.target.backend or ""
        for key in ("transforms", "sequence"):
            known = {t.id for t in self.catalog.transformations_for(kernel, backend)}
            for i, tid in enumerate(get(key, [])):
                if not isinstance(tid, str) or tid not in known:
                    raise self.fail(f"{entry.key(key)}[{i}]", f"unknown transformation {tid!r} for "
                                                      f"{kernel} on {backend}")
        options: dict[str, Any] = {k: settings[k] for k in _AS_OPTIONS if k in settings}
        options["applier"] = get("applier", self.overrides.applier)
        options["llm_settings"] = {k: get(k) for k in ("temperature", "repairs",
                                                       "max_tokens_total")
                                   if get(k) is not None}
        for key, option in (("transforms", "only"), ("sequence", "sequence")):
            if key in settings:
                options[option] = tuple(settings[key])
        for key in ("polish", "build_budget"):
            if key in settings:
                options[key] = float(settings[key])
        timing = config.run.eval_config
        if "timeout" in settings:
            timing = dataclasses.replace(timing, timeout_s=float(settings["timeout"]))
        if "repeats" in settings:
            timing = dataclasses.replace(timing, repeats=int(settings["repeats"]))
        options["eval_config"] = timing
        return config.with_options(**options)


def _kind_name(kind: str) -> str:
    return {"str": "a string", "int": "an integer", "list": "a list", "dict": "a table",
            "number": "a number"}.get(kind, kind)
