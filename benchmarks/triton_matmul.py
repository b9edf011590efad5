"""The peer a user would pick instead: Triton's tutorial matmul, autotuned over 8 common
configurations, timed against torch's cuBLAS with triton.testing.do_bench (L2 flushed
between repeats, median). fp32 is IEEE (no TF32); fp16 accumulates in fp32.
Only for the GPU machine, where Triton and torch are installed."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

_CONFIGS = [
    triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_stages=s, num_warps=w)
    for bm, bn, bk, s, w in [
        (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
        (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
        (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
    ]
]


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K", "IEEE"])
@triton.jit
def _matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,  # noqa: N803
            IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,  # noqa: N803
            GROUP: tl.constexpr):  # noqa: N803
    pid = tl.program_id(0)
    blocks_m, blocks_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP * blocks_n)
    first_m = group * GROUP
    size_m = min(blocks_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * blocks_n)) % size_m
    pid_n = (pid % (GROUP * blocks_n)) // size_m
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    pa = a + rm[:, None] * sam + rk[None, :] * sak
    pb = b + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        ta = tl.load(pa, mask=rk[None, :] < K - k * BK, other=0.0)
        tb = tl.load(pb, mask=rk[:, None] < K - k * BK, other=0.0)
        acc = tl.dot(ta, tb, acc, input_precision="ieee" if IEEE else "tf32")
        pa += BK * sak
        pb += BK * sbk
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    tl.store(c + cm[:, None] * scm + cn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(cm[:, None] < M) & (cn[None, :] < N))


def triton_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)

    def grid(meta: dict[str, int]) -> tuple[int]:
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    _matmul[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                  c.stride(0), c.stride(1), IEEE=a.dtype == torch.float32)
    return c


def matmul_ratio(dtype: str, n: int) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False
    kind = {"float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[dtype]
    a = torch.randn((n, n), device="cuda", dtype=kind)
    b = torch.randn((n, n), device="cuda", dtype=kind)
    expected = (a.double() @ b.double())
    got = triton_matmul(a, b).double()
    error = float(((got - expected).abs() / (a.double().abs() @ b.double().abs())).max())
    flops = 2.0 * n ** 3
    triton_ms = triton.testing.do_bench(lambda: triton_matmul(a, b), warmup=50, rep=300)
    cublas_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300)
    return {
        "triton_tflops": flops / triton_ms / 1e9, "cublas_torch_tflops": flops / cublas_ms / 1e9,
        "ratio": cublas_ms / triton_ms, "max_scaled_error": error,
        "config": str(_matmul.best_config),
        "timer": "triton.testing.do_bench (median, L2 flushed)",
    }
