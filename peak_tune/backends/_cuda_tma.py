"""TMA tensor maps for the CUDA worker: a `tma_<buffer>` launch key (see _cuda_launch)
becomes a CUtensorMap, encoded on the host by the driver (cuTensorMapEncodeTiled, through
ctypes: CuPy does not wrap it) and copied into device memory, where the kernel reads it
by pointer. A buffer TMA cannot describe (its address or row pitch not a multiple of 16
bytes) gets a null pointer instead, and the kernel copies that operand another way.

The map treats a row-major rows x cols buffer as a 2-D tensor of unsigned integers of
the element's width: TMA only copies, and elements outside the tensor arrive as zero
bits, which is +0.0 in every float type.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from peak_tune.backends._cuda_launch import TensorMapBox
from peak_tune.errors import InvalidPoint

__all__ = ["TENSOR_MAP_BYTES", "TensorMapLayout", "encode", "layout_for"]

TENSOR_MAP_BYTES = 128
_ALIGN = 16  # bytes: global address and row pitch
_DIM_LIMIT = 2**32
_PITCH_LIMIT = 2**40
# CUtensorMapDataType by element width (UINT8, UINT16, UINT32, UINT64)
_UNSIGNED = {1: 0, 2: 1, 4: 2, 8: 4}
_SWIZZLE_MODES = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_*
_L2_PROMOTION_256B = 3
_INTERLEAVE_NONE = 0
_OOB_FILL_ZERO = 0


@dataclass(frozen=True)
class TensorMapLayout:
    """cuTensorMapEncodeTiled's arguments for one box over one buffer (innermost first)."""

    data_type: int
    address: int
    dims: tuple[int, int]  # (cols, rows)
    pitch: int  # bytes from one row to the next
    box: tuple[int, int]  # (cols, rows)
    swizzle_mode: int


def layout_for(box: TensorMapBox, shape: tuple[int, ...], itemsize: int,
               address: int) -> TensorMapLayout | None:
    """The map of `box` over a row-major buffer, or None where TMA cannot describe the
    buffer; InvalidPoint for a box TMA cannot move (the kernel's tiling is at fault)."""
    if itemsize not in _UNSIGNED:
        raise InvalidPoint(f"TMA cannot copy {itemsize}-byte elements")
    row_bytes = box.cols * itemsize
    if row_bytes % _ALIGN:
        raise InvalidPoint(f"TMA box of {box.buffer}: a row of {box.cols} elements is "
                           f"{row_bytes} bytes, not a multiple of {_ALIGN}")
    if box.swizzle and row_bytes > box.swizzle:
        raise InvalidPoint(f"TMA box of {box.buffer}: a row of {row_bytes} bytes is wider "
                           f"than its {box.swizzle}-byte swizzle")
    if len(shape) != 2:
        raise InvalidPoint(f"TMA maps 2-D buffers; {box.buffer} has shape {shape}")
    rows, cols = shape
    pitch = cols * itemsize
    if (address % _ALIGN or pitch % _ALIGN or not 0 < cols < _DIM_LIMIT
            or not 0 < rows < _DIM_LIMIT or pitch >= _PITCH_LIMIT):
        return None
    return TensorMapLayout(_UNSIGNED[itemsize], address, (cols, rows), pitch,
                           (box.cols, box.rows), _SWIZZLE_MODES[box.swizzle])


_driver: list[ctypes.CDLL] = []


def encode(layout: TensorMapLayout) -> bytes:
    """The 128-byte CUtensorMap, from the driver; InvalidPoint if it refuses."""
    if not _driver:
        _driver.append(ctypes.CDLL("libcuda.so.1"))
    function = _driver[0].cuTensorMapEncodeTiled
    function.restype = ctypes.c_int
    storage = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + 64))()  # CUtensorMap is 64-byte aligned
    aligned = (ctypes.addressof(storage) + 63) // 64 * 64
    u64x2, u32x2 = ctypes.c_uint64 * 2, ctypes.c_uint32 * 2
    status = function(
        ctypes.c_void_p(aligned), ctypes.c_int(layout.data_type), ctypes.c_uint32(2),
        ctypes.c_void_p(layout.address), u64x2(*layout.dims), (ctypes.c_uint64 * 1)(layout.pitch),
        u32x2(*layout.box), u32x2(1, 1), ctypes.c_int(_INTERLEAVE_NONE),
        ctypes.c_int(layout.swizzle_mode), ctypes.c_int(_L2_PROMOTION_256B),
        ctypes.c_int(_OOB_FILL_ZERO))
    if status != 0:
        raise InvalidPoint(f"the driver cannot encode a TMA tensor map for {layout} "
                           f"(CUresult {status})")
    return ctypes.string_at(aligned, TENSOR_MAP_BYTES)
