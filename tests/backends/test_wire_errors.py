"""A worker's typed errors arrive as the same class in the tuner's process."""

from __future__ import annotations

import pytest

from peak_tune.backends._worker_child import _encode_error
from peak_tune.backends.worker import _decode_error
from peak_tune.errors import (
    CompileError,
    InvalidPoint,
    KernelCrash,
    NoVendorLibrary,
    UserError,
    WrongResult,
)


@pytest.mark.parametrize("error", [
    WrongResult("C[3] off"), CompileError("no such type"), InvalidPoint("too much LDS"),
    NoVendorLibrary("no GEMM for softmax"), UserError("no cuBLAS baseline for int8"),
])
def test_an_error_keeps_its_class_across_the_pipe(error: Exception) -> None:
    back = _decode_error(_encode_error(error))
    assert type(back) is type(error) and str(back) == str(error)


def test_a_kernel_without_a_vendor_gemm_is_no_vendor_library_not_a_user_error() -> None:
    # a CUDA study of a kernel that is not a GEMM measures against the documented peak
    back = _decode_error(_encode_error(NoVendorLibrary("for matmul only (not 'softmax')")))
    assert isinstance(back, NoVendorLibrary) and not isinstance(back, KernelCrash)
