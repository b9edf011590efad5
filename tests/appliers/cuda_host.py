"""Run the reference applier's CUDA SIMT kernels on the host, to check them without a GPU.

The printed kernel is compiled as C++20 with tests/fixtures/cuda_host/shim.h: one
std::thread per CUDA thread, a std::barrier per block for __syncthreads, __shared__ as a
static shared by the block's threads, blocks one after another. That covers the fp32
kernels without cp.async (pipelining), split-k's atomics or tensor cores. The output
arrives NaN-poisoned between guard zones; the check is numpy's float64 product.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from peak_tune.backends._cuda_launch import evaluate_launch
from peak_tune.core import KernelContext

SHIM = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_host"
GUARD = 256  # floats of sentinel around C
SENTINEL = 12345.0

needs_gpp = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20)")

_MAIN = r"""
#include <cstdio>
#include <vector>
%(kernel)s
int main(int argc, char **argv) {
    const int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]), guard = atoi(argv[4]);
    const dim3 grid{(unsigned)atoi(argv[5]), (unsigned)atoi(argv[6]), (unsigned)atoi(argv[7])};
    const dim3 block{(unsigned)atoi(argv[8]), (unsigned)atoi(argv[9]), (unsigned)atoi(argv[10])};
    std::vector<float> a((size_t)M * K), b((size_t)K * N), c((size_t)M * N + 2 * guard);
    FILE *in = fopen(argv[11], "rb");
    if (fread(a.data(), 4, a.size(), in) != a.size() || fread(b.data(), 4, b.size(), in) != b.size()
        || fread(c.data(), 4, c.size(), in) != c.size()) return 2;
    fclose(in);
    pt_host_launch(grid, block, [&] { %(entry)s(a.data(), b.data(), c.data() + guard, M, N, K); });
    FILE *out = fopen(argv[12], "wb");
    fwrite(c.data(), 4, c.size(), out);
    fclose(out);
    return 0;
}
"""


def run_on_host(context: KernelContext, params: Mapping[str, int], size: tuple[int, int, int],
                folder: Path, seed: int = 0) -> None:
    """Build `context` at `params`, run it at M, N, K = `size` and assert that C is right
    to fp32 accuracy and that nothing outside C was written."""
    m, n, k = size
    geometry = evaluate_launch(context.launch, {**params, "M": m, "N": n, "K": k})
    assert geometry.shared_bytes == 0, "the host shim runs static shared memory only"
    program, binary = folder / "kernel.cpp", folder / "kernel"
    program.write_text(_MAIN % {"kernel": context.source, "entry": context.entry})
    flags = [f"-D{name}={value}" for name, value in sorted(params.items())]
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", f"-I{SHIM / 'include'}",
                    "-include", str(SHIM / "shim.h"), "-DDTYPE=float", "-DACC=float", *flags,
                    str(program), "-o", str(binary)], check=True, capture_output=True)
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.full(m * n + 2 * GUARD, np.nan, np.float32)
    c[:GUARD] = c[-GUARD:] = SENTINEL
    inputs, output = folder / "in.bin", folder / "out.bin"
    inputs.write_bytes(a.tobytes() + b.tobytes() + c.tobytes())
    subprocess.run([str(binary), str(m), str(n), str(k), str(GUARD), *map(str, geometry.grid),
                    *map(str, geometry.block), str(inputs), str(output)], check=True,
                   timeout=120)
    got = np.frombuffer(output.read_bytes(), np.float32)
    assert (got[:GUARD] == SENTINEL).all() and (got[-GUARD:] == SENTINEL).all(), \
        "wrote outside C"
    expected = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    error = np.abs(got[GUARD:-GUARD].reshape(m, n) - expected)
    assert np.isfinite(got).all() and (error <= 1e-5 * scale + 1e-6).all(), \
        f"wrong result at {m}x{n}x{k}: {int((~(error <= 1e-5 * scale + 1e-6)).sum())} elements"
