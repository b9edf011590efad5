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
SENTINEL = 1024.0  # exact in fp16 too: the guards go through DTYPE and back

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
    std::vector<DTYPE> ad(a.begin(), a.end()), bd(b.begin(), b.end()), cd(c.begin(), c.end());
    pt_host_launch(grid, block,
                   [&] { %(entry)s(ad.data(), bd.data(), cd.data() + guard, M, N, K); });
    for (size_t i = 0; i < c.size(); ++i) c[i] = (float)cd[i];
    FILE *out = fopen(argv[12], "wb");
    fwrite(c.data(), 4, c.size(), out);
    fclose(out);
    return 0;
}
"""
# dtype -> (DTYPE, numpy type of the inputs, relative tolerance of C)
HOST_TYPES = {"float32": ("float", np.float32, 1e-5), "float16": ("__half", np.float16, 2e-3)}
CUDA_SHIM_COMPILER = ("g++", f"-I{SHIM / 'include'}", "-include", str(SHIM / "shim.h"))


def run_on_host(context: KernelContext, params: Mapping[str, int],
                sizes: tuple[tuple[int, int, int], ...], folder: Path, *,
                compiler: tuple[str, ...] = CUDA_SHIM_COMPILER, dtype: str = "float32",
                seed: int = 0) -> None:
    """Build `context` at `params` with `compiler` (a C++20 compiler and the flags of a
    host shim: CUDA's by default), run it at each M, N, K of `sizes` and assert that C
    is right to the element type's accuracy and that nothing outside C was written."""
    element, np_type, tolerance = HOST_TYPES[dtype]
    program, binary = folder / "kernel.cpp", folder / f"kernel-{dtype}"
    program.write_text(_MAIN % {"kernel": context.source, "entry": context.entry})
    flags = [f"-D{name}={value}" for name, value in sorted(params.items())]
    built = subprocess.run([compiler[0], "-std=c++20", "-O1", "-pthread", *compiler[1:],
                            f"-DDTYPE={element}", "-DACC=float", *flags, str(program), "-o",
                            str(binary)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    rng = np.random.default_rng(seed)
    for m, n, k in sizes:
        geometry = evaluate_launch(context.launch, {**params, "M": m, "N": n, "K": k})
        assert geometry.shared_bytes == 0, "the host shim runs static shared memory only"
        # inputs exactly representable in the element type: the check sees only the sums
        a = rng.uniform(-1, 1, (m, k)).astype(np_type).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np_type).astype(np.float32)
        c = np.full(m * n + 2 * GUARD, np.nan, np.float32)
        c[:GUARD] = c[-GUARD:] = SENTINEL
        inputs, output = folder / "in.bin", folder / "out.bin"
        inputs.write_bytes(a.tobytes() + b.tobytes() + c.tobytes())
        subprocess.run([str(binary), str(m), str(n), str(k), str(GUARD),
                        *map(str, geometry.grid), *map(str, geometry.block), str(inputs),
                        str(output)], check=True, timeout=300)
        got = np.frombuffer(output.read_bytes(), np.float32)
        assert (got[:GUARD] == SENTINEL).all() and (got[-GUARD:] == SENTINEL).all(), \
            f"wrote outside C at {m}x{n}x{k}"
        expected = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        error = np.abs(got[GUARD:-GUARD].reshape(m, n) - expected)
        wrong = ~(error <= tolerance * scale + 1e-6)
        assert np.isfinite(got).all() and not wrong.any(), \
            f"{dtype}: wrong result at {m}x{n}x{k}: {int(wrong.sum())} elements"
