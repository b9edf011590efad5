"""Load and check catalog files: seed specs, natural transformations, device profiles.

Every problem is a CatalogError naming the file and the field. Unknown keys are errors.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from peak_tune.catalog.types import DTYPES, TESTED, DeviceProfile, Pass, Transformation
from peak_tune.core import ArgSpec, KernelSpec, ParamDomain, ProblemSize, VendorCall
from peak_tune.errors import CatalogError, ExpressionError
from peak_tune.expr import check_expression

__all__ = [
    "load_device",
    "load_spec",
    "load_transformation",
    "load_transformations",
    "load_devices",
]

_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_MACRO = re.compile(r"^[A-Z][A-Z0-9_]*$")
_REGIONS = ("device", "launch", "macros")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise CatalogError(path, "", "file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(path, "", f"not valid TOML: {exc}") from exc


def _check_keys(path: Path, table: Mapping[str, Any], required: set[str], optional: set[str],
                where: str = "") -> None:
    prefix = f"{where}." if where else ""
    for key in sorted(required - table.keys()):
        raise CatalogError(path, prefix + key, "missing")
    for key in sorted(table.keys() - required - optional):
        raise CatalogError(path, prefix + key, "unknown field")


def _typed(path: Path, field: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise CatalogError(path, field, f"expected {names}, got {type(value).__name__}")
    return value


def _str_list(path: Path, field: str, value: Any) -> tuple[str, ...]:
    _typed(path, field, value, list)
    return tuple(_typed(path, f"{field}[{i}]", v, str) for i, v in enumerate(value))


def _expression(path: Path, field: str, text: Any, allowed: set[str]) -> str:
    _typed(path, field, text, str)
    try:
        check_expression(text, allowed)
    except ExpressionError as exc:
        raise CatalogError(path, field, str(exc)) from exc
    return str(text)


# ---------------------------------------------------------------- seed specs

def _size(path: Path, field: str, table: Any, symbols: tuple[str, ...]) -> ProblemSize:
    _typed(path, field, table, dict)
    _check_keys(path, table, set(symbols), set(), field)
    for key, value in table.items():
        if _typed(path, f"{field}.{key}", value, int) <= 0:
            raise CatalogError(path, f"{field}.{key}", "must be positive")
    return ProblemSize.of({s: table[s] for s in symbols})


def _arg(path: Path, index: int, table: Any, symbols: set[str]) -> ArgSpec:
    where = f"args[{index}]"
    _typed(path, where, table, dict)
    kind = _typed(path, f"{where}.kind", table.get("kind"), str)
    if kind == "buffer":
        _check_keys(path, table, {"name", "kind", "shape", "intent"}, {"init"}, where)
        shape = _str_list(path, f"{where}.shape", table["shape"])
        for i, dim in enumerate(shape):
            _expression(path, f"{where}.shape[{i}]", dim, symbols)
        intent = table["intent"]
        if intent not in ("in", "out", "inout"):
            raise CatalogError(path, f"{where}.intent", f"{intent!r} is not in, out or inout")
        init = table.get("init", "uniform")
        if init not in ("uniform", "normal", "zeros"):
            raise CatalogError(path, f"{where}.init", f"{init!r} is not uniform, normal or zeros")
        return ArgSpec(table["name"], "buffer", shape=shape, intent=intent, init=init)
    if kind == "scalar":
        _check_keys(path, table, {"name", "kind", "value"}, set(), where)
        value = _expression(path, f"{where}.value", table["value"], symbols)
        return ArgSpec(_typed(path, f"{where}.name", table["name"], str), "scalar", value=value)
    raise CatalogError(path, f"{where}.kind", f"{kind!r} is not buffer or scalar")


def load_spec(folder: Path) -> KernelSpec:
    """Load seeds/<kernel>/spec.toml and the seed sources it names."""
    path = folder / "spec.toml"
    data = _read_toml(path)
    _check_keys(
        path, data,
        {"name", "description", "sizes", "default_size", "flops", "min_bytes", "reference",
         "error_scale", "dtypes", "tolerance", "args", "sources", "entry"},
        {"check_sizes", "launch", "projection", "vendor"},
    )
    symbols = _str_list(path, "sizes", data["sizes"])
    args = tuple(_arg(path, i, a, set(symbols)) for i, a in enumerate(_typed(
        path, "args", data["args"], list)))
    buffers = {a.name for a in args if a.kind == "buffer" and a.intent != "out"}
    tolerances = _typed(path, "tolerance", data["tolerance"], dict)
    for dtype, tol in tolerances.items():
        _typed(path, f"tolerance.{dtype}", tol, (int, float))
    dtypes = _str_list(path, "dtypes", data["dtypes"])
    for dtype in dtypes:
        if dtype not in tolerances:
            raise CatalogError(path, f"tolerance.{dtype}", "missing for a listed dtype")
    sources: dict[str, str] = {}
    for backend, name in _typed(path, "sources", data["sources"], dict).items():
        source_path = folder / _typed(path, f"sources.{backend}", name, str)
        if not source_path.is_file():
            raise CatalogError(path, f"sources.{backend}", f"file {name!r} not found")
        sources[backend] = source_path.read_text()
    entry = _typed(path, "entry", data["entry"], dict)
    for backend in sources:
        if backend not in entry:
            raise CatalogError(path, f"entry.{backend}", "missing for a backend with a source")
    return KernelSpec(
        name=_typed(path, "name", data["name"], str),
        description=_typed(path, "description", data["description"], str),
        size_symbols=symbols,
        default_size=_size(path, "default_size", data["default_size"], symbols),
        args=args,
        flops=_expression(path, "flops", data["flops"], set(symbols)),
        min_bytes=_expression(path, "min_bytes", data["min_bytes"], set(symbols) | {"elem"}),
        reference=_expression(path, "reference", data["reference"], buffers),
        error_scale=_expression(path, "error_scale", data["error_scale"], buffers),
        tolerances={k: float(v) for k, v in tolerances.items()},
        dtypes=dtypes,
        sources=sources,
        entry={k: str(v) for k, v in entry.items()},
        check_sizes=tuple(
            _size(path, f"check_sizes[{i}]", s, symbols)
            for i, s in enumerate(_typed(path, "check_sizes", data.get("check_sizes", []), list))
        ),
        launch=_launch(path, data.get("launch", {}), set(symbols)),
        folder=str(folder),
        projection=_projection(path, data.get("projection", {}), buffers),
        vendor=_vendor(path, data.get("vendor", {}), args),
    )


_GEMM_CALLS = (VendorCall.GEMM, VendorCall.GEMM_BT)


def _vendor(path: Path, table: Any, args: tuple[ArgSpec, ...]) -> dict[str, str]:
    """[vendor]: backend -> call. A GEMM call needs two inputs and one output whose shapes
    name the same sizes as C = A @ B (or A @ B^T), with at most one shared batch size."""
    _typed(path, "vendor", table, dict)
    calls = {}
    for backend, text in table.items():
        where = f"vendor.{backend}"
        try:
            call = VendorCall(_typed(path, where, text, str))
        except ValueError:
            raise CatalogError(path, where, f"{text!r} is not one of "
                               f"{', '.join(c.value for c in VendorCall)}") from None
        if call is VendorCall.REFERENCE and backend != "c":
            raise CatalogError(path, where, "numpy's reference runs on the CPU (c) only")
        if call in _GEMM_CALLS:
            problem = _gemm_mismatch(args, call is VendorCall.GEMM_BT)
            if problem:
                raise CatalogError(path, where, f"{call.value} needs {problem}")
        calls[str(backend)] = call.value
    return calls


def _gemm_mismatch(args: tuple[ArgSpec, ...], b_transposed: bool) -> str:
    """'' when the buffers are A [.., M, K], B [.., K, N] (or [.., N, K]) and C [.., M, N]
    with one optional shared leading size; else what is wrong, in words."""
    ins = [a for a in args if a.kind == "buffer" and a.intent == "in"]
    outs = [a for a in args if a.kind == "buffer" and a.intent != "in"]
    if len(ins) != 2 or len(outs) != 1:
        return "two input buffers and one output"
    (a, b), c = ins, outs[0]
    ranks = {len(a.shape), len(b.shape), len(c.shape)}
    if len(ranks) != 1 or ranks.pop() not in (2, 3):
        return "A, B and C of one rank, 2 (or 3 with a batch)"
    if len({x.shape[:-2] for x in (a, b, c)}) != 1:
        return "one batch size shared by A, B and C"
    m, k = a.shape[-2:]
    n = b.shape[-2] if b_transposed else b.shape[-1]
    if tuple(b.shape[-2:]) != ((n, k) if b_transposed else (k, n)) or c.shape[-2:] != (m, n):
        layout = "N, K" if b_transposed else "K, N"
        return (f"shapes A [.., M, K], B [.., {layout}], C [.., M, N] (found A "
                f"{list(a.shape)}, B {list(b.shape)}, C {list(c.shape)})")
    return ""


def _projection(path: Path, table: Any, inputs: set[str]) -> dict[str, str]:
    """[projection]: right/left -> the input buffer the reference is linear in."""
    _typed(path, "projection", table, dict)
    for side, name in table.items():
        if side not in ("right", "left"):
            raise CatalogError(path, f"projection.{side}", "is not right or left")
        if _typed(path, f"projection.{side}", name, str) not in inputs:
            raise CatalogError(path, f"projection.{side}", f"{name!r} is not an input buffer")
    return {str(k): str(v) for k, v in table.items()}


# The HLSL backend's launch may use the shader's own thread group, which it reads from
# the SPIR-V (numthreads): group_x, group_y, group_z.
SHADER_GROUP_NAMES = frozenset({"group_x", "group_y", "group_z"})


def _launch(path: Path, table: Any, symbols: set[str]) -> dict[str, dict[str, str]]:
    """[launch.<backend>]: name -> expression in the size symbols (grid, block, shared)."""
    _typed(path, "launch", table, dict)
    launch: dict[str, dict[str, str]] = {}
    for backend, entries in table.items():
        _typed(path, f"launch.{backend}", entries, dict)
        names = symbols | SHADER_GROUP_NAMES if backend == "hlsl" else symbols
        launch[backend] = {name: _expression(path, f"launch.{backend}.{name}", text, names)
                           for name, text in entries.items()}
    return launch


# ---------------------------------------------------------- transformations

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*\n(.*)\Z", re.S)
_PASS_HEADING = re.compile(r"^##\s+Pass\s+(\d+)\b[^\n]*$", re.M)
_TRANSFORM_REQUIRED = {"id", "version", "title", "kernels", "backends", "params", "passes"}
_TRANSFORM_OPTIONAL = {"summary", "requires", "conflicts", "constraints", "defaults", "dtypes",
                       "vendors"}


def _params(path: Path, table: Any) -> tuple[ParamDomain, ...]:
    _typed(path, "params", table, dict)
    domains = []
    for name, values in table.items():
        if not isinstance(name, str) or not _MACRO.match(name):
            raise CatalogError(path, f"params.{name}", "a parameter name is an upper-case macro")
        _typed(path, f"params.{name}", values, list)
        if not values:
            raise CatalogError(path, f"params.{name}", "needs at least one value")
        for i, v in enumerate(values):
            _typed(path, f"params.{name}[{i}]", v, int)
        if len(set(values)) != len(values):
            raise CatalogError(path, f"params.{name}", "values repeat")
        domains.append(ParamDomain(name, tuple(values)))
    return tuple(domains)


def _defaults(path: Path, table: Any, params: tuple[ParamDomain, ...]) -> dict[str, int]:
    """`defaults: {NAME: value}`: the value `peak-tune apply` uses when none is given."""
    _typed(path, "defaults", table, dict)
    domains = {p.name: p for p in params}
    for name, value in table.items():
        if name not in domains:
            raise CatalogError(path, f"defaults.{name}", "not a parameter of this transformation")
        if _typed(path, f"defaults.{name}", value, int) not in domains[name].values:
            raise CatalogError(path, f"defaults.{name}",
                               f"{value} is not one of {list(domains[name].values)}")
    return dict(table)


def _passes(path: Path, declared: Any, body: str) -> tuple[Pass, ...]:
    _typed(path, "passes", declared, list)
    if not declared:
        raise CatalogError(path, "passes", "needs at least one pass")
    headings = list(_PASS_HEADING.finditer(body))
    if len(headings) != len(declared):
        raise CatalogError(
            path, "passes",
            f"front matter declares {len(declared)} pass(es), text has {len(headings)} "
            "'## Pass N' heading(s)",
        )
    passes = []
    for i, (entry, heading) in enumerate(zip(declared, headings, strict=True)):
        _typed(path, f"passes[{i}]", entry, dict)
        _check_keys(path, entry, {"region"}, set(), f"passes[{i}]")
        if entry["region"] not in _REGIONS:
            raise CatalogError(path, f"passes[{i}].region",
                               f"{entry['region']!r} is not one of {', '.join(_REGIONS)}")
        if int(heading.group(1)) != i + 1:
            raise CatalogError(path, f"passes[{i}]", f"heading says Pass {heading.group(1)}")
        end = headings[i + 1].start() if i + 1 < len(headings) else len(body)
        text = body[heading.end():end].strip()
        if not text:
            raise CatalogError(path, f"passes[{i}]", "the pass has no text")
        passes.append(Pass(entry["region"], text))
    return tuple(passes)


def _dtypes(path: Path, declared: Any) -> tuple[str, ...]:
    dtypes = _str_list(path, "dtypes", declared)
    for i, dtype in enumerate(dtypes):
        if dtype not in DTYPES:
            raise CatalogError(path, f"dtypes[{i}]",
                               f"{dtype!r} is not one of {', '.join(DTYPES)}")
    return dtypes


def load_transformation(path: Path) -> Transformation:
    """Parse one transformation file (Markdown with YAML front matter)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(path, "", f"cannot read: {exc.strerror}") from exc
    match = _FRONT_MATTER.match(text)
    if not match:
        raise CatalogError(path, "front matter", "file must start with a '---' YAML block")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise CatalogError(path, "front matter", f"not valid YAML: {exc}".splitlines()[0]) from exc
    _typed(path, "front matter", meta, dict)
    _check_keys(path, meta, _TRANSFORM_REQUIRED, _TRANSFORM_OPTIONAL)
    tid = _typed(path, "id", meta["id"], str)
    if not _ID.match(tid):
        raise CatalogError(path, "id", f"{tid!r}: use lower-case letters, digits and '-'")
    if path.stem != tid:
        raise CatalogError(path, "id", f"{tid!r} differs from the file name {path.stem!r}")
    version = _typed(path, "version", meta["version"], int)
    params = _params(path, meta["params"])
    names = {p.name for p in params}
    constraints = _str_list(path, "constraints", meta.get("constraints", []))
    for i, c in enumerate(constraints):
        _expression(path, f"constraints[{i}]", c, names)
    return Transformation(
        id=tid,
        version=version,
        title=_typed(path, "title", meta["title"], str),
        kernels=_str_list(path, "kernels", meta["kernels"]),
        backends=_str_list(path, "backends", meta["backends"]),
        requires=_str_list(path, "requires", meta.get("requires", [])),
        conflicts=_str_list(path, "conflicts", meta.get("conflicts", [])),
        params=params,
        constraints=constraints,
        passes=_passes(path, meta["passes"], match.group(2)),
        summary=str(meta.get("summary", "")),
        path=str(path),
        defaults=_defaults(path, meta.get("defaults", {}), params),
        dtypes=_dtypes(path, meta.get("dtypes", [])),
        vendors=_str_list(path, "vendors", meta.get("vendors", [])),
    )


def load_transformations(folders: Iterable[Path]) -> dict[str, Transformation]:
    """All transformations under the folders (recursively); later folders override."""
    found: dict[str, Transformation] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.md")):
            if path.name.lower() == "readme.md":
                continue
            transformation = load_transformation(path)
            found[transformation.id] = transformation
    for t in found.values():
        for field in ("requires", "conflicts"):
            for other in getattr(t, field):
                if other not in found:
                    raise CatalogError(t.path, field, f"unknown transformation {other!r}")
    return found


# ---------------------------------------------------------- device profiles

def load_device(path: Path) -> DeviceProfile:
    data = _read_toml(path)
    _check_keys(path, data, {"name", "title", "backend", "peak_gflops", "memory_bandwidth_gbs"},
                {"facts", "tested"})
    tested = _typed(path, "tested", data.get("tested", "none"), str)
    if tested not in TESTED:
        raise CatalogError(path, "tested", f"{tested!r}: use one of {', '.join(TESTED)}")
    if data["name"] != path.stem:
        raise CatalogError(path, "name", f"{data['name']!r} differs from the file name")
    peaks = _typed(path, "peak_gflops", data["peak_gflops"], dict)
    for dtype, value in peaks.items():
        _typed(path, f"peak_gflops.{dtype}", value, (int, float))
    facts = _typed(path, "facts", data.get("facts", {}), dict)
    for key, value in facts.items():
        _typed(path, f"facts.{key}", value, (int, float, str))
    return DeviceProfile(
        name=data["name"],
        title=_typed(path, "title", data["title"], str),
        backend=_typed(path, "backend", data["backend"], str),
        peak_gflops={k: float(v) for k, v in peaks.items()},
        memory_bandwidth_gbs=float(
            _typed(path, "memory_bandwidth_gbs", data["memory_bandwidth_gbs"], (int, float))),
        facts=facts,
        tested=tested,
        path=str(path),
    )


def load_devices(folders: Iterable[Path]) -> dict[str, DeviceProfile]:
    found: dict[str, DeviceProfile] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.toml")):
            device = load_device(path)
            found[device.name] = device
    return found
