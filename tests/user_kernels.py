"""A user's own kernels for CLI tests: a catalog holding one seed (matmul's spec under
another name, with the given C source), and kernels that misbehave in timing."""

from __future__ import annotations

import shutil
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[1] / "seeds"

# The naive matmul, then a sleep of 0-20 ms that differs on every call: its timings
# spread far past any threshold, every time it is measured.
SLEEPY_C = r"""
#include <time.h>
#include <unistd.h>
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    /* 0-20 ms of sleep, drawn afresh each call (a generator seeded from the clock once:
       the clock's own microseconds can alias with a steady run period and repeat) */
    static unsigned state;
    if (state == 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        state = (unsigned)now.tv_nsec | 1u;
    }
    state = state * 1103515245u + 12345u;
    usleep((useconds_t)((state >> 8) % 20000));
}
"""


def one_seed_catalog(folder: Path, name: str, source: str) -> Path:
    """A user's own kernel `name` (matmul's spec, `source` as its C seed): no
    transformation applies to it, so a study of it times the seed alone."""
    seed = folder / "seeds" / name
    seed.mkdir(parents=True)
    spec = (SEEDS / "matmul" / "spec.toml").read_text()
    seed.joinpath("spec.toml").write_text(spec.replace('name = "matmul"', f'name = "{name}"', 1))
    seed.joinpath("naive.c").write_text(source)
    for other in ("naive.cu", "naive.hip", "naive.hlsl"):  # the spec names the GPU seeds too
        shutil.copy(SEEDS / "matmul" / other, seed / other)
    return folder
