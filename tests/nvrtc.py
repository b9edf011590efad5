"""Skip marker for tests that compile CUDA with NVRTC from the pip wheels."""

from __future__ import annotations

import pytest

from peak_tune.backends._nvrtc import nvrtc_version
from peak_tune.errors import BackendUnavailable


def _nvrtc_missing() -> str | None:
    try:
        nvrtc_version()
    except BackendUnavailable as exc:
        return str(exc)
    return None


needs_nvrtc = pytest.mark.skipif(_nvrtc_missing() is not None,
                                 reason=f"NVRTC not available: {_nvrtc_missing()}")
