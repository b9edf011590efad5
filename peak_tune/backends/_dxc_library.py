"""DXC's compiler library as a `dxc` command: `python -m peak_tune.backends._dxc_library
--library LIB [dxc options] SOURCE -Fo OUTPUT`, the options those of `dxc` itself.

The PyPI source package `compushady` ships DXC 1.7 as `libdxcompiler_<machine>.so.3.7`
(its own binding passes fixed options: no -D, no 16-bit types), and that library is all
DXC is: `DxcCreateInstance(CLSID_DxcCompiler, IID_IDxcCompiler3)` gives a COM object
whose `Compile` takes the command line's arguments. It runs in a process of its own, as
any compiler here, so that a crash or a hang of DXC costs only the build
(backends._compiler.run_compiler stops it).

On Linux and macOS DXC's IUnknown has a virtual destructor after Release (WinAdapter.h):
two more vtable slots under the Itanium C++ ABI, so an interface's own methods start at
slot 5, not 3 as on Windows.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import uuid
from pathlib import Path

from peak_tune.backends._packaged import (
    exit_past_destructors,
    library_command,
    packaged_library,
)

__all__ = ["find_library", "main"]

_FIRST_METHOD = 3 if platform.system() == "Windows" else 5
_UTF8 = 65001  # DXC_CP_UTF8
_LIBRARY_ENV = "PEAK_TUNE_DXC_LIBRARY"


class _Guid(ctypes.Structure):
    _fields_ = [("data1", ctypes.c_uint32), ("data2", ctypes.c_uint16),
                ("data3", ctypes.c_uint16), ("data4", ctypes.c_ubyte * 8)]

    @classmethod
    def of(cls, text: str) -> _Guid:
        raw = uuid.UUID(text).bytes
        guid = cls(int.from_bytes(raw[0:4], "big"), int.from_bytes(raw[4:6], "big"),
                   int.from_bytes(raw[6:8], "big"))
        guid.data4[:] = list(raw[8:16])
        return guid


class _Buffer(ctypes.Structure):  # DxcBuffer
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("encoding", ctypes.c_uint32)]


_CLSID_COMPILER = _Guid.of("73e22d93-e6ce-47f3-b5bf-f0664f39c1b0")
_IID_COMPILER3 = _Guid.of("228b4687-5a6a-4730-900c-9702b2203f54")
_IID_RESULT = _Guid.of("58346cda-dde7-4497-9461-6f87af5e0659")


def find_library() -> str | None:
    """$PEAK_TUNE_DXC_LIBRARY, else the DXC library inside an installed compushady."""
    name = ("libdxcompiler.3.7.dylib" if platform.system() == "Darwin"
            else f"libdxcompiler_{platform.machine()}.so.3.7")
    return packaged_library(_LIBRARY_ENV, "compushady", f"backends/{name}")


def _method(obj: ctypes.c_void_p, index: int, restype: object, *argtypes: object) -> object:
    """Method `index` of a COM object's interface (0: its first own method)."""
    table = ctypes.cast(obj, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)))[0]
    prototype = ctypes.CFUNCTYPE(restype, ctypes.c_void_p, *argtypes)  # type: ignore[arg-type]
    return prototype(table[_FIRST_METHOD + index])


def _blob_bytes(blob: ctypes.c_void_p) -> bytes:
    pointer = _method(blob, 0, ctypes.c_void_p)(blob)  # type: ignore[operator]
    size = _method(blob, 1, ctypes.c_size_t)(blob)  # type: ignore[operator]
    return ctypes.string_at(pointer, size) if pointer and size else b""


def compile_with(library: str, source: bytes, arguments: list[str]) -> tuple[int, bytes, str]:
    """(DXC's status, the object it built, its messages)."""
    dxc = ctypes.CDLL(library)
    create = dxc.DxcCreateInstance
    create.restype = ctypes.c_int32
    create.argtypes = [ctypes.POINTER(_Guid), ctypes.POINTER(_Guid),
                       ctypes.POINTER(ctypes.c_void_p)]
    compiler = ctypes.c_void_p()
    failed = create(ctypes.byref(_CLSID_COMPILER), ctypes.byref(_IID_COMPILER3),
                    ctypes.byref(compiler))
    if failed or not compiler:
        raise OSError(f"DxcCreateInstance failed (0x{failed & 0xFFFFFFFF:08x})")
    text = ctypes.create_string_buffer(source)
    buffer = _Buffer(ctypes.cast(text, ctypes.c_void_p), len(source), _UTF8)
    argv = (ctypes.c_wchar_p * len(arguments))(*arguments)
    result = ctypes.c_void_p()
    compile_ = _method(compiler, 0, ctypes.c_int32, ctypes.POINTER(_Buffer),
                       ctypes.POINTER(ctypes.c_wchar_p), ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(_Guid), ctypes.POINTER(ctypes.c_void_p))
    failed = compile_(compiler, ctypes.byref(buffer), argv,  # type: ignore[operator]
                      len(arguments), None, ctypes.byref(_IID_RESULT), ctypes.byref(result))
    if failed or not result:
        raise OSError(f"IDxcCompiler3::Compile failed (0x{failed & 0xFFFFFFFF:08x})")
    status = ctypes.c_int32()
    _method(result, 0, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32))(  # type: ignore[operator]
        result, ctypes.byref(status))
    built, errors = ctypes.c_void_p(), ctypes.c_void_p()
    _method(result, 1, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))(  # type: ignore[operator]
        result, ctypes.byref(built))
    _method(result, 2, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))(  # type: ignore[operator]
        result, ctypes.byref(errors))
    messages = _blob_bytes(errors).decode(errors="replace") if errors else ""
    return status.value, _blob_bytes(built) if built else b"", messages


def main(argv: list[str]) -> int:
    """`--library LIB [options] SOURCE -Fo OUTPUT` as `dxc [options] SOURCE -Fo OUTPUT`."""

    def build(library: str, before: list[str], after: list[str]) -> tuple[bool, bytes, str]:
        source = Path(before[-1])
        status, built, messages = compile_with(library, source.read_bytes(),
                                               before[:-1] + after)
        return status == 0, built, messages.replace("hlsl.hlsl", str(source))

    return library_command(argv, "-Fo", "python -m peak_tune.backends._dxc_library "
                           "--library LIB [dxc options] SOURCE -Fo OUTPUT", build)


if __name__ == "__main__":
    exit_past_destructors(main(sys.argv[1:]))
