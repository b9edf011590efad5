"""Launch geometry of a CUDA variant: KernelContext.launch, evaluated and checked.

`KernelContext.launch` maps these names to expressions in the problem sizes and the
tuning parameters (peak_tune.expr): grid_x, grid_y, grid_z, block_x, block_y, block_z
and shared_bytes (dynamic shared memory). grid_x and block_x are required; the other
extents default to 1 and shared_bytes to 0. A geometry the device cannot launch (too
many threads, too much shared memory) is an InvalidPoint: pruned, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peak_tune.errors import CompileError, ExpressionError, InvalidPoint
from peak_tune.expr import evaluate_int, names_in

__all__ = ["LAUNCH_KEYS", "Geometry", "check_launch", "evaluate_launch", "geometry_fits"]

LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_bytes")
_REQUIRED = ("grid_x", "block_x")
_DEFAULTS = {"grid_y": "1", "grid_z": "1", "block_y": "1", "block_z": "1", "shared_bytes": "0"}
_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_BLOCK_LIMITS = (1024, 1024, 64)


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
    None: any name)."""
    if not launch:
        raise CompileError("compile error: the variant has no launch geometry (KernelContext."
                           "launch needs grid_x, block_x, ...) for the CUDA backend")
    unknown = sorted(set(launch) - set(LAUNCH_KEYS))
    if unknown:
        raise CompileError(f"compile error: unknown launch key(s) {unknown}; "
                           f"expected {', '.join(LAUNCH_KEYS)}")
    missing = [key for key in _REQUIRED if key not in launch]
    if missing:
        raise CompileError(f"compile error: launch needs {', '.join(missing)}")
    for key, text in launch.items():
        try:
            free = names_in(text)
        except ExpressionError as exc:
            raise CompileError(f"compile error: launch {key}: {exc}") from exc
        if names is not None and free - names:
            raise CompileError(f"compile error: launch {key} = {text!r} uses unknown "
                               f"name(s) {sorted(free - names)}")


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
