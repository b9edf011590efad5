"""Slang's compiler library as a `slangc` command: `python -m peak_tune.backends.
_slang_library --library LIB SOURCE [slangc options] -o OUTPUT`, the options those of
`slangc` itself (-target spirv -entry main -stage compute -profile ... -DNAME=VALUE).

Slang reads HLSL and adds what DXC 1.7 and glslang lack, cooperative matrices above all
(`linalg.CoopMat`, `coopMatMulAdd`: SPV_KHR_cooperative_matrix, NVIDIA's tensor cores
through Vulkan). Its compiler ships as `libslang-compiler.so` inside the `slangpy` wheel,
whose C API takes slangc's command line (spProcessCommandLineArguments). It runs in a
process of its own, as every compiler here, so that a crash or a hang of Slang costs only
the build (backends._compiler.run_compiler stops it).
"""

from __future__ import annotations

import ctypes
import platform
import re
import sys

from peak_tune.backends._packaged import (
    exit_past_destructors,
    library_command,
    packaged_library,
)

__all__ = ["find_library", "main"]

_LIBRARY_ENV = "PEAK_TUNE_SLANG_LIBRARY"
_HEADER = re.compile(r"^(error|warning)\[E\d+\]: (.*)$")
_WHERE = re.compile(r"^\s*--> (.+):(\d+):(\d+)$")
_CARET = re.compile(r"^\s*\|\s*\^+\s*(.*)$")


def find_library() -> str | None:
    """$PEAK_TUNE_SLANG_LIBRARY, else the compiler library inside an installed slangpy."""
    pattern = ("libslang-compiler*.dylib" if platform.system() == "Darwin"
               else "libslang-compiler.so*")
    return packaged_library(_LIBRARY_ENV, "slangpy", pattern)


def _bound(library: str) -> ctypes.CDLL:
    slang = ctypes.CDLL(library)
    pointer, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    for name, restype, argtypes in (
            ("spCreateSession", pointer, [text]),
            ("spCreateCompileRequest", pointer, [pointer]),
            ("spProcessCommandLineArguments", ctypes.c_int32,
             [pointer, ctypes.POINTER(text), ctypes.c_int]),
            ("spCompile", ctypes.c_int32, [pointer]),
            ("spGetDiagnosticOutput", text, [pointer]),
            ("spGetCompileRequestCode", pointer, [pointer, ctypes.POINTER(size)]),
            ("spDestroyCompileRequest", None, [pointer]),
            ("spDestroySession", None, [pointer])):
        function = getattr(slang, name)
        function.restype, function.argtypes = restype, argtypes
    return slang


def compile_with(library: str, arguments: list[str]) -> tuple[int, bytes, str]:
    """(Slang's status, the module it built, its messages) for slangc's `arguments`."""
    slang = _bound(library)
    session = slang.spCreateSession(None)
    request = slang.spCreateCompileRequest(session)
    if not session or not request:
        raise OSError("Slang would not start a compile session")
    try:
        encoded = [a.encode() for a in arguments]
        argv = (ctypes.c_char_p * len(encoded))(*encoded)
        status = slang.spProcessCommandLineArguments(request, argv, len(encoded))
        if status >= 0:
            status = slang.spCompile(request)
        messages = (slang.spGetDiagnosticOutput(request) or b"").decode(errors="replace")
        built = b""
        if status >= 0:
            size = ctypes.c_size_t()
            code = slang.spGetCompileRequestCode(request, ctypes.byref(size))
            built = ctypes.string_at(code, size.value) if code and size.value else b""
        return status, built, messages
    finally:
        slang.spDestroyCompileRequest(request)
        slang.spDestroySession(session)


def error_lines(messages: str) -> list[str]:
    """Slang's boxed diagnostics (a header, an arrow to the place, the line with carets
    and the detail under it) as one `path:line:col: error: detail` line per error, the
    form the other compilers print and backends._compiler reads."""
    found, header, where = [], "", ""
    for line in messages.splitlines():
        if match := _HEADER.match(line):
            header = match.group(2) if match.group(1) == "error" else ""
            where = ""
        elif header and (match := _WHERE.match(line)):
            where = f"{match.group(1)}:{match.group(2)}:{match.group(3)}"
        elif header and where and (match := _CARET.match(line)):
            found.append(f"{where}: error: {match.group(1) or header}")
            header = ""
    return found


def main(argv: list[str]) -> int:
    """`--library LIB SOURCE [options] -o OUTPUT` as `slangc SOURCE [options] -o OUTPUT`."""

    def build(library: str, before: list[str], after: list[str]) -> tuple[bool, bytes, str]:
        status, built, messages = compile_with(library, before + after)
        lines = "".join(f"{line}\n" for line in error_lines(messages))
        return status >= 0, built, lines + messages

    return library_command(argv, "-o", "python -m peak_tune.backends._slang_library "
                           "--library LIB SOURCE [slangc options] -o OUTPUT", build)


if __name__ == "__main__":
    exit_past_destructors(main(sys.argv[1:]))
