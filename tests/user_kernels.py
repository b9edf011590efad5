"""A user's own kernels for CLI tests: a catalog holding one seed (matmul's spec under
another name, with the given C source), and kernels that misbehave in timing."""

from __future__ import annotations

import shutil
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[1] / "seeds"

# The naive matmul, then a sleep of 20 ms on every second call: its timings spread far
# past any threshold, every time it is measured.
SLEEPY_C = r"""
#include <unistd.h>
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    /* 20 ms of sleep on every second call: the timed runs alternate slow and fast,
       so their spread is about 1 or far more, never steady, however many runs (3 or
       more) the harness takes. A random 0-20 ms drawn each call read steady in about 4%
       of studies (three attempts of seven runs, each under a spread of 0.5 in 1.4%). */
    static unsigned calls;
    if (++calls % 2) usleep(20000);
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
