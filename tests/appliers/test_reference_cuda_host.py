"""The reference applier's fp32 CUDA kernels, run on the host (tests/appliers/cuda_host.py):
correct at odd sizes, with and without double-buffer and interior-tiles, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.appliers.conftest import build_cuda as build
from tests.appliers.cuda_host import needs_gpp, run_on_host

SEQUENCES = {
    "staged": ("refactor", "tb-tiling", "register-staging", "thread-tiling"),
    "double-buffered": ("refactor", "tb-tiling", "register-staging", "double-buffer",
                        "thread-tiling"),
    # search-8's best fp32 kernel, double-buffered
    "search-8 double-buffered": ("refactor", "thread-tiling", "tb-tiling", "register-staging",
                                 "double-buffer", "vector-loads", "warp-tiling", "block-swizzle",
                                 "transpose", "launch-bounds"),
    "search-8 double-buffered, interior unchecked": (
        "refactor", "thread-tiling", "tb-tiling", "register-staging", "double-buffer",
        "vector-loads", "warp-tiling", "block-swizzle", "transpose", "launch-bounds",
        "interior-tiles"),
    "interior unchecked, elements": ("refactor", "tb-tiling", "interior-tiles",
                                     "register-staging", "thread-tiling"),
    "cached, chunked, padded": ("refactor", "tb-tiling", "register-staging", "double-buffer",
                                "thread-tiling", "thread-cache", "thread-chunk", "offset",
                                "vector-loads"),
}
POINT = {"BLOCK_M": 32, "BLOCK_N": 64, "TILE_K_SIZE": 8, "TRD_Y_DIM": 4, "TRD_X_DIM": 4,
         "WARP_X_DIM": 4, "SWIZZLE_GROUP": 2, "MIN_BLOCKS_PER_SM": 1, "THREAD_CHUNK": 2,
         "OFFSET_AMOUNT": 4}


@needs_gpp
@pytest.mark.parametrize("kernel", list(SEQUENCES))
# (70, 150, 64): interior blocks and blocks at the M and N edges in one launch
@pytest.mark.parametrize("size", [(67, 53, 97), (64, 128, 16), (70, 150, 64), (33, 130, 9),
                                  (1, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp32_kernels_are_correct_on_the_host(kernel, size, cuda_catalog, cuda_seed, h200,
                                              tmp_path: Path):
    context = build(cuda_seed, SEQUENCES[kernel], cuda_catalog, h200)
    params = {p.name: POINT[p.name] for p in context.params}
    run_on_host(context, params, (size,), tmp_path)
