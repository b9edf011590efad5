"""NVRTC through cuda-python: CUDA C++ to a cubin, with no GPU and no CUDA context.

The CUDA backend compiles here, in the tuner's process, so that compiling needs no
device (CPU machines, parallel with timing) and the evaluation worker only loads the
cubin. Resources come without a GPU: registers, stack frame and static shared memory
from the cubin's ELF sections, spills from ptxas's verbose report (`--ptxas-options=-v`)
where NVRTC's log carries it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from peak_tune.errors import BackendUnavailable, CompileError, InvalidPoint

__all__ = ["Compiled", "compile_cubin", "cubin_resources", "include_dir", "nvrtc_version",
           "ptxas_resources"]

_log = logging.getLogger(__name__)

_INSTALL_HINT = "pip install 'peak-tune[cuda-compile]' (cuda-python and NVIDIA's NVRTC wheels)"
# ptxas cannot fit one instruction (a wgmma's accumulators) under the register limit that
# __launch_bounds__ set: "(C7602) Insufficient registers (128) ... target of 154 or higher"
_REGISTERS_REFUSED = re.compile(r"Insufficient registers \((\d+)\).*?target of (\d+)")
_ERROR_LINE = re.compile(r"^[^\s(]*\((\d+)\): (?:catastrophic )?error: (.*)$")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RESOURCES = (
    ("registers", re.compile(r"Used (\d+) registers")),
    ("stack_bytes", re.compile(r"(\d+) bytes stack frame")),
    ("spill_store_bytes", re.compile(r"(\d+) bytes spill stores")),
    ("spill_load_bytes", re.compile(r"(\d+) bytes spill loads")),
    ("shared_static_bytes", re.compile(r"(\d+) bytes smem")),
    ("barriers", re.compile(r"used (\d+) barriers")),
)


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str


@functools.cache
def _binding() -> ModuleType:
    """cuda-python's NVRTC module (cuda.bindings.nvrtc, or cuda.nvrtc before 12.6)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc
        except ImportError as exc:
            raise BackendUnavailable(
                f"compiling CUDA needs NVRTC from cuda-python: {_INSTALL_HINT}") from exc
    try:
        _checked(nvrtc, nvrtc.nvrtcVersion())
    except Exception as exc:  # the library itself is missing: DynamicLibNotFoundError, ...
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BackendUnavailable(f"NVRTC cannot be loaded ({message}): {_INSTALL_HINT}") from exc
    return nvrtc


def _checked(nvrtc: ModuleType, result: Any) -> Any:
    """cuda-python returns (status, *values): the values, or an error for a bad status."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC call failed: {status!r}")
    return values[0] if len(values) == 1 else tuple(values)


def nvrtc_version() -> str:
    """e.g. "13.0"; BackendUnavailable when cuda-python or libnvrtc is missing."""
    nvrtc = _binding()
    major, minor = _checked(nvrtc, nvrtc.nvrtcVersion())
    return f"{major}.{minor}"


@functools.cache
def include_dir() -> str | None:
    """The folder holding cuda_fp16.h that matches NVRTC, or None if none is found.

    In order: cuda-pathfinder's CUDA-runtime headers (pip wheels or $CUDA_PATH),
    $CUDA_PATH / $CUDA_HOME, NVIDIA's pip wheels on sys.path, /usr/local/cuda.
    """
    candidates: list[Path] = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(Path(found))
    except Exception:  # an old cuda-pathfinder without it, or nothing found
        pass
    for variable in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]) / "include")
    for entry in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
            candidates.append(Path(entry or ".") / sub)
    candidates.append(Path("/usr/local/cuda/include"))
    for folder in candidates:
        if (folder / "cuda_fp16.h").is_file():
            return str(folder)
    _log.warning("no folder with cuda_fp16.h found: kernels including it will not compile")
    return None


def compile_cubin(source: str, options: Sequence[str], name: str = "kernel.cu") -> Compiled:
    """Compile `source`; the cubin and NVRTC's log, or CompileError naming the first error."""
    nvrtc = _binding()
    program = _checked(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [],
                                                       []))
    try:
        encoded = [o.encode() for o in options]
        status = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)[0]
        log = _program_log(nvrtc, program)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            refused = _REGISTERS_REFUSED.search(log)
            if refused:  # the tuning point's register limit, not the code, is at fault
                raise InvalidPoint(f"ptxas: {refused.group(1)} registers a thread (the launch "
                                   f"bounds) are fewer than one instruction needs "
                                   f"({refused.group(2)} or more)")
            shown = "$ nvrtc " + " ".join(options) + "\n"
            raise CompileError(f"compile error: {_first_error(log, status)}", detail=shown + log)
        cubin = bytearray(_checked(nvrtc, nvrtc.nvrtcGetCUBINSize(program)))
        _checked(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin))
        return Compiled(bytes(cubin), log)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _program_log(nvrtc: ModuleType, program: Any) -> str:
    # A fresh bytearray: NVRTC writes into the buffer, and `b" " * 1` would be Python's
    # shared one-byte constant.
    buffer = bytearray(_checked(nvrtc, nvrtc.nvrtcGetProgramLogSize(program)))
    _checked(nvrtc, nvrtc.nvrtcGetProgramLog(program, buffer))
    return bytes(buffer).rstrip(b"\0").decode(errors="replace")


def _first_error(log: str, status: Any) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        found = _ERROR_LINE.match(line)
        if found:
            return f"line {found.group(1)}: {found.group(2)}"
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[0] if lines else f"NVRTC failed ({status!r})"


def ptxas_resources(log: str, entry: str) -> dict[str, int]:
    """Registers, stack, spills, static shared memory of `entry` from ptxas's -v report."""
    sections = _ENTRY.split(log)  # [before, name1, text1, name2, text2, ...]
    for name, text in zip(sections[1::2], sections[2::2], strict=True):
        if name != entry:
            continue
        found: dict[str, int] = {}
        for key, pattern in _RESOURCES:
            match = pattern.search(text)
            found[key] = int(match.group(1)) if match else 0
        return found
    return {}


_EIATTR_NAMES = {0x2F: "registers", 0x11: "stack_bytes"}  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE
_RESERVED_SHARED_BYTES = 1024  # counted in .nv.shared.<entry> where .nv.shared.reserved.0 is


def cubin_resources(cubin: bytes, entry: str) -> dict[str, int]:
    """Registers, stack frame and static shared memory of `entry`, read from the cubin.

    For when ptxas's report is missing from NVRTC's log: NVRTC 13.0 (CUDA 13.0.2's
    wheels) was seen to give it for the first build per architecture in a process only.
    Spills are in ptxas's report alone. Empty if the cubin is not the ELF64 expected.
    """
    try:
        sections = _elf_sections(cubin)
        symbols = _elf_symbols(cubin, sections)
        info = sections[".nv.info"]
    except (KeyError, ValueError, IndexError, struct.error):
        return {}
    shared = sections.get(f".nv.shared.{entry}", (0, 0, 0))[1]
    if shared and ".nv.shared.reserved.0" in sections:
        shared -= _RESERVED_SHARED_BYTES
    found: dict[str, int] = {"shared_static_bytes": max(shared, 0)}
    offset, end = info[0], info[0] + info[1]
    while offset + 4 <= end:
        form, attribute = cubin[offset], cubin[offset + 1]
        size = struct.unpack_from("<H", cubin, offset + 2)[0] if form == 4 else 0
        if form == 4 and attribute in _EIATTR_NAMES and size == 8:
            index, value = struct.unpack_from("<II", cubin, offset + 4)
            if symbols.get(index) == entry:
                found[_EIATTR_NAMES[attribute]] = value
        offset += 4 + size
    return found


def _elf_sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """Section name -> (offset, size, link) of a little-endian ELF64 file."""
    if data[:5] != b"\x7fELF\x02":
        raise ValueError("not an ELF64 file")
    table = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, table + i * entry_size)
               for i in range(count)]
    names_at = headers[names_index][4]

    def name(at: int) -> str:
        start = names_at + at
        return data[start:data.index(b"\0", start)].decode()

    return {name(h[0]): (h[4], h[5], h[6]) for h in headers}


def _elf_symbols(data: bytes, sections: dict[str, tuple[int, int, int]]) -> dict[int, str]:
    offset, size, _ = sections[".symtab"]
    strings = sections[".strtab"][0]
    symbols: dict[int, str] = {}
    for index in range(size // 24):
        name_at = struct.unpack_from("<I", data, offset + 24 * index)[0]
        start = strings + name_at
        symbols[index] = data[start:data.index(b"\0", start)].decode()
    return symbols
