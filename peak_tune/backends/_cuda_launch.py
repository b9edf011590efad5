"""Launch geometry of a CUDA variant: KernelContext.launch, evaluated and checked.

`KernelContext.launch` maps these names to expressions in the problem sizes and the
tuning parameters (peak_tune.expr): grid_x, grid_y, grid_z, block_x, block_y, block_z
and shared_bytes (dynamic shared memory). grid_x and block_x are required; the other
extents default to 1 and shared_bytes to 0. A geometry the device cannot launch (too
many threads, too much shared memory) is an InvalidPoint: pruned, not an error. Besides
the sizes and parameters an expression may name what the running device is (DEVICE_NAMES:
`SMS`, its multiprocessor count, for a persistent kernel's grid of one block per SM).

`tma_<BUFFER>` asks for a TMA tensor map of a 2-D buffer: "ROWS, COLS, SWIZZLE", the box
(rows x columns of elements) one cp.async.bulk.tensor moves and the shared-memory swizzle
in bytes (0, 32, 64 or 128). The kernel takes one more parameter per map, after the
spec's, in the spec's buffer order: a pointer to the 128-byte CUtensorMap in global
memory, or null where TMA cannot describe the buffer (see _cuda_tma); the kernel then
copies another way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from peak_tune.errors import CompileError, ExpressionError, InvalidPoint
from peak_tune.expr import evaluate_int, names_in

__all__ = ["DEVICE_NAMES", "LAUNCH_KEYS", "TMA_PREFIX", "Geometry", "TensorMapBox", "check_launch",
           "evaluate_launch", "geometry_fits", "tensor_map_boxes"]

LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_bytes")
_REQUIRED = ("grid_x", "block_x")
_DEFAULTS = {"grid_y": "1", "grid_z": "1", "block_y": "1", "block_z": "1", "shared_bytes": "0"}
TMA_PREFIX = "tma_"
# names a launch expression may use that the device worker sets from the device it runs on
DEVICE_NAMES = ("SMS",)  # multiprocessors (CUDA SMs, AMD compute units)
_TMA_SWIZZLES = (0, 32, 64, 128)
_TMA_BOX_LIMIT = 256  # elements per box dimension
_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_BLOCK_LIMITS = (1024, 1024, 64)


@dataclass(frozen=True)
class TensorMapBox:
    """What a `tma_<buffer>` launch key asks for, evaluated at one point."""

    buffer: str
    rows: int
    cols: int
    swizzle: int  # bytes: 0 (none), 32, 64 or 128


@dataclass(frozen=True)
class Geometry:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def label(self) -> str:
        grid = "x".join(map(str, self.grid))
        block = "x".join(map(str, self.block))
        return f"grid {grid}, block {block}, {self.shared_bytes} B dynamic shared memory"


def check_launch(launch: Mapping[str, str], names: set[str] | None) -> None:
    """CompileError unless every required key is there, no key is unknown and every
    expression parses and uses only `names` (the size symbols and the tuning parameters;
    None: any name) and DEVICE_NAMES."""
    if not launch:
        raise CompileError("compile error: the variant has no launch geometry (KernelContext."
                           "launch needs grid_x, block_x, ...) for the CUDA backend")
    unknown = sorted(key for key in launch
                     if key not in LAUNCH_KEYS and not _is_tma_key(key))
    if unknown:
        raise CompileError(f"compile error: unknown launch key(s) {unknown}; "
                           f"expected {', '.join(LAUNCH_KEYS)} or {TMA_PREFIX}<buffer>")
    missing = [key for key in _REQUIRED if key not in launch]
    if missing:
        raise CompileError(f"compile error: launch needs {', '.join(missing)}")
    for key, text in launch.items():
        parts = _tma_parts(key, text) if _is_tma_key(key) else [text]
        try:
            free = set().union(*(names_in(part) for part in parts))
        except ExpressionError as exc:
            raise CompileError(f"compile error: launch {key}: {exc}") from exc
        unknown_names = free - names - set(DEVICE_NAMES) if names is not None else set()
        if unknown_names:
            raise CompileError(f"compile error: launch {key} = {text!r} uses unknown "
                               f"name(s) {sorted(unknown_names)}")


def _is_tma_key(key: str) -> bool:
    return key.startswith(TMA_PREFIX) and key[len(TMA_PREFIX):].isidentifier()


def _tma_parts(key: str, text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise CompileError(f"compile error: launch {key} = {text!r}: expected \"ROWS, COLS, "
                           "SWIZZLE\" (the box and the swizzle in bytes)")
    return parts


def tensor_map_boxes(
    launch: Mapping[str, str], names: Mapping[str, int], buffers: Sequence[str]
) -> list[TensorMapBox]:
    """The tensor maps the launch asks for, in the order of `buffers` (the spec's buffer
    arguments): CompileError for a buffer the spec lacks, InvalidPoint for a box TMA
    cannot move (any side above 256 elements, a swizzle other than 0/32/64/128)."""
    asked = {key[len(TMA_PREFIX):]: text for key, text in launch.items() if _is_tma_key(key)}
    unknown = sorted(set(asked) - set(buffers))
    if unknown:
        raise CompileError(f"compile error: launch asks for tensor maps of {unknown}, which "
                           f"are not buffers of the kernel ({', '.join(buffers)})")
    boxes = []
    for buffer in (b for b in buffers if b in asked):
        key = TMA_PREFIX + buffer
        try:
            rows, cols, swizzle = (evaluate_int(part, names)
                                   for part in _tma_parts(key, asked[buffer]))
        except ExpressionError as exc:
            raise CompileError(f"compile error: launch {key}: {exc}") from exc
        if not (1 <= rows <= _TMA_BOX_LIMIT and 1 <= cols <= _TMA_BOX_LIMIT):
            raise InvalidPoint(f"TMA box {rows} x {cols} of {buffer}: each side must be "
                               f"1..{_TMA_BOX_LIMIT} elements")
        if swizzle not in _TMA_SWIZZLES:
            raise InvalidPoint(f"TMA swizzle of {buffer} is {swizzle} bytes; expected one "
                               f"of {_TMA_SWIZZLES}")
        boxes.append(TensorMapBox(buffer, rows, cols, swizzle))
    return boxes


def evaluate_launch(launch: Mapping[str, str], names: Mapping[str, int]) -> Geometry:
    """The geometry at these sizes and parameter values; InvalidPoint if not launchable."""
    values: dict[str, int] = {}
    for key in LAUNCH_KEYS:
        text = launch.get(key, _DEFAULTS.get(key, ""))
        try:
            values[key] = evaluate_int(text, names)
        except ExpressionError as exc:
            raise CompileError(f"compile error: launch {key}: {exc}") from exc
    geometry = Geometry(
        grid=(values["grid_x"], values["grid_y"], values["grid_z"]),
        block=(values["block_x"], values["block_y"], values["block_z"]),
        shared_bytes=values["shared_bytes"],
    )
    for axis, (extent, limit) in enumerate(zip(geometry.grid, _GRID_LIMITS, strict=True)):
        if not 1 <= extent <= limit:
            raise InvalidPoint(f"grid extent {'xyz'[axis]} = {extent} is outside 1..{limit}")
    for axis, (extent, limit) in enumerate(zip(geometry.block, _BLOCK_LIMITS, strict=True)):
        if not 1 <= extent <= limit:
            raise InvalidPoint(f"block extent {'xyz'[axis]} = {extent} is outside 1..{limit}")
    if geometry.shared_bytes < 0:
        raise InvalidPoint(f"negative dynamic shared memory: {geometry.shared_bytes} bytes")
    return geometry


def geometry_fits(
    geometry: Geometry, max_threads: int, static_shared: int, shared_limit: int
) -> None:
    """InvalidPoint when the block has more threads than the function allows or its shared
    memory (static + dynamic) exceeds what a block may have on the device."""
    if geometry.threads > max_threads:
        raise InvalidPoint(f"block of {geometry.threads} threads exceeds this function's "
                           f"limit of {max_threads} (registers or device)")
    total = static_shared + geometry.shared_bytes
    if total > shared_limit:
        raise InvalidPoint(f"{total} bytes of shared memory per block ({static_shared} static "
                           f"+ {geometry.shared_bytes} dynamic) exceed the device's "
                           f"{shared_limit}")
