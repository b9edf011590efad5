"""A CUDA backend whose GPU answers at once: the driver's side of a study, without a GPU.

Builds as the CUDA backend does when asked to (NVRTC from the pip wheels), or not at all;
every evaluation returns a time that depends only on the variant, as a fast, steady GPU
would. Used where what is measured or tested is the trial loop itself (the sampler, the
polisher, the tell order), never a kernel's speed. `build_s` and `device_s` make it a
model of a real study instead: a build sleeps a time spread around build_s (0.25x to 4x,
fixed per variant, as large unrolled kernels build slower), a timing sleeps device_s.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize


class InstantCudaBackend(CudaBackend):
    compile_for_real = False
    build_s = 0.0  # median seconds a build sleeps (0: none)
    device_s = 0.0  # seconds an evaluation sleeps, as a device timing would
    evaluations = 0  # evaluations so far (one timer thread: no lock needed)

    def probe(self) -> Any:
        return self._profile

    def fingerprint(self) -> Mapping[str, str]:
        return {"device": "instant stand-in"}

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        if self.compile_for_real:
            return super().compile(context, params, dtype, build_dir, time_limit_s)
        key = hashlib.sha256(repr((context.content_hash(), sorted(params.items()))).encode())
        if self.build_s:
            time.sleep(self.build_s * 4.0 ** (2 * int(key.hexdigest()[6:12], 16) / 0xFFFFFF - 1))
        return Artifact(path="/dev/null", compile_key=key.hexdigest())

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        time.sleep(self.device_s)
        InstantCudaBackend.evaluations += 1
        ms = 5.0 + 20.0 * int(artifact.compile_key[:6], 16) / 0xFFFFFF
        size = request.size.as_dict()
        return Measurement((ms, ms, ms), 2.0 * size["M"] * size["N"] * size["K"])

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        return "none", Measurement((3.0,), 1.0)
