"""The CUDA backend: NVRTC compiles, a killable CuPy worker validates and times.

Compiling happens here, in the tuner's process, through NVRTC (cuda-python): it needs no
GPU and no CUDA context, so builds can run on CPU machines and in parallel with timing.
A variant becomes <build_dir>/<key>.cubin for the profile's architecture (facts.arch),
with tuning parameters as -D macros, the element type as -DDTYPE and the accumulator as
-DACC. Artifact.resources holds the entry's registers, stack frame and static shared
memory (read from the cubin) and spills (ptxas's report). Everything on the GPU runs in
a child process (peak_tune.backends._cuda_worker) that owns the CUDA context: an illegal
address or a trap kills only that process, a hang is killed at the deadline, and either
way the next evaluation starts in a fresh one. cuBLAS is timed there by the same code.

The launch geometry is data: KernelContext.launch (see _cuda_launch). A geometry the
device cannot run (threads per block, shared memory) raises InvalidPoint: pruned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from peak_tune.backends._cuda_launch import (
    check_launch,
    evaluate_launch,
    geometry_fits,
    tensor_map_boxes,
)
from peak_tune.backends._files import built_or_reused
from peak_tune.backends._gpu_runner import WORKER_MODULE, GpuRunner, evaluation_message
from peak_tune.backends._ncu import ProfileReport, find_cuda_tool, profile_request
from peak_tune.backends._nvrtc import include_dir, nvrtc_version
from peak_tune.backends._nvrtc_process import build_cubin
from peak_tune.backends.base import Artifact, Capabilities, EvalConfig, EvalRequest
from peak_tune.backends.wire import (
    macro_flags,
)
from peak_tune.backends.worker import child_env
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize, stable_hash
from peak_tune.errors import (
    BackendUnavailable,
    KernelCrash,
    KernelTimeout,
    UserError,
    WrongResult,
)
from peak_tune.evaluation.validation import size_label
from peak_tune.expr import evaluate, names_in

__all__ = ["FLAGS", "HARNESS_VERSION", "CudaBackend", "profile_for_gpu", "visible_gpu"]

_log = logging.getLogger(__name__)

HARNESS_VERSION = "cuda-3"  # bump when validation or timing in the worker changes
# No -lineinfo: nothing here reads source lines back (ncu's summary is by metric), and
# without it NVRTC built the Hopper kernels in 0.88-0.96x the time at the same speed
# (benchmarks/compile_flags.py, 2026-12-06 on an H100).
FLAGS: tuple[str, ...] = ("-std=c++17", "--ptxas-options=-v")
# dtype -> (DTYPE, ACC): fp16 in and out with fp32 accumulation
_CUDA_TYPES = {"float32": ("float", "float"), "float16": ("__half", "float"),
               "bfloat16": ("__nv_bfloat16", "float"),
               "float64": ("double", "double")}
_RESERVED_MACROS = {"DTYPE", "ACC"}
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SANITIZER_ERRORS = 99  # compute-sanitizer's exit status when it found errors
_SANITIZER_TIMEOUT_S = 600.0
_WRONG_RESULT_STATUS = 3  # the one-shot worker's exit status for a wrong result
_UNAVAILABLE = "CUDA backend needs a GPU and cupy: pip install 'peak-tune[cuda]' ({reason})"


class CudaBackend:
    """Backend "cuda": see the module docstring. Construct with a CUDA DeviceProfile.

    One instance drives one worker process (device 0 of CUDA_VISIBLE_DEVICES); use it
    from one thread at a time. compile() needs no GPU.
    """

    name = "cuda"
    capabilities = Capabilities(on_host=False, host_code=False, launch_region=True,
                                sanitizer=True, profiler=True, tensor_maps=True)

    build_command = "NVRTC " + " ".join(FLAGS) + " -arch=sm_<the device's> (then cubin)"
    element_types = _CUDA_TYPES  # dtype -> (DTYPE, ACC) of the source language

    @classmethod
    def element_macros(cls, dtype: str) -> dict[str, str]:
        """What a build of `dtype` defines besides the tuning values (see export)."""
        element, accumulator = cls.element_types.get(dtype, ("", ""))
        return {"DTYPE": element, "ACC": accumulator} if element else {}

    def __init__(self, profile: DeviceProfile) -> None:
        self._profile = profile
        self._runner = GpuRunner(profile, _UNAVAILABLE, self._check_device)

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ device

    def probe(self) -> DeviceProfile:
        """The profile, once the GPU is found and matches its architecture."""
        self._device_info()
        return self._profile

    def fingerprint(self) -> Mapping[str, str]:
        info = self._device_info()
        return {
            "device": f"{info['name']} (sm_{info['compute_capability']})",
            "driver": f"{info['driver'] or 'unknown'} (CUDA {info['driver_cuda']})",
            "cuda_runtime": f"{info['runtime_cuda']} (cupy {info['cupy']})",
            "compiler": f"NVRTC {nvrtc_version()}",
            "flags": " ".join((*FLAGS, f"-arch={self._arch()}")),
            "harness": HARNESS_VERSION,
        }

    def _arch(self) -> str:
        arch = str(self._profile.facts.get("arch", ""))
        if not re.fullmatch(r"sm_\d+a?", arch):
            raise UserError(f"device profile {self._profile.name!r} needs facts.arch like "
                            f"'sm_90', not {arch!r}")
        return arch

    def _device_info(self) -> dict[str, Any]:
        return self._runner.info()

    def _check_device(self, info: Mapping[str, Any]) -> None:
        if info.get("platform", "cuda") != "cuda":
            raise BackendUnavailable(
                f"this GPU is {info['name']} ({info.get('arch', '?')}), run through HIP: "
                f"device profile {self._profile.name!r} is for an NVIDIA GPU")
        wanted = self._arch().removeprefix("sm_").rstrip("a")
        if info["compute_capability"] != wanted:
            raise BackendUnavailable(
                f"this GPU is {info['name']} (sm_{info['compute_capability']}) but device "
                f"profile {self._profile.name!r} is for {self._arch()}: choose the "
                "profile of this GPU with --device")

    # ------------------------------------------------------------ compile

    def compile(
        self, context: KernelContext, params: Mapping[str, int], dtype: str, build_dir: str,
        time_limit_s: float = 0.0,
    ) -> Artifact:
        """Build <build_dir>/<key>.cubin with NVRTC (in a compiler process, stopped past
        `time_limit_s`), or reuse an identical build."""
        if dtype not in self.element_types:
            raise UserError(f"the {self.name.upper()} backend supports dtypes "
                            f"{', '.join(self.element_types)}, "
                            f"not {dtype!r}")
        check_launch(context.launch, None)
        self._check_resources(context, params, None)  # before NVRTC: no build to waste
        options = self.nvrtc_options(params, dtype)
        version = nvrtc_version()
        identity = {"build": context.build_identity(), "options": options,
                    "params": sorted(params.items()), "nvrtc": version}
        identity.update(self._language_identity())
        key = stable_hash(identity)

        def build(cubin: Path) -> tuple[str, dict[str, int]]:
            return build_cubin(context.source, [*options, *self.include_flags()],
                               f"{key}.cu", context.entry, cubin, time_limit_s)

        artifact = built_or_reused(build_dir, key, ".cubin", build)
        self._check_resources(context, params, artifact)
        return artifact

    def nvrtc_options(self, params: Mapping[str, int], dtype: str) -> list[str]:
        """NVRTC's options for a build at `params` in `dtype`, part of the build's key (the
        header folders aside: include_flags)."""
        element, accumulator = self.element_types[dtype]
        return [*FLAGS, f"-arch={self._arch()}", f"-DDTYPE={element}", f"-DACC={accumulator}",
                *self._language_defines(), *macro_flags(params, _RESERVED_MACROS)]

    def include_flags(self) -> list[str]:
        """-I for the language's headers and the CUDA toolkit's (cuda_fp16.h and the like,
        found by include_dir)."""
        headers = [*self._language_includes(), *([include_dir()] if include_dir() else [])]
        return [f"-I{h}" for h in headers]

    # The source language: CUDA here; HIP on NVIDIA (backends.hip) adds its header.
    def _language_defines(self) -> list[str]:
        return []

    def _language_includes(self) -> list[str]:
        return []

    def _language_identity(self) -> dict[str, str]:
        """What else a build's key holds (the added headers' content)."""
        return {}

    def _check_resources(
        self, context: KernelContext, params: Mapping[str, int], artifact: Artifact | None
    ) -> None:
        """InvalidPoint for a block or shared memory the profile's device cannot give, where
        the launch fixes them by parameters alone (the worker checks every size again).
        Without an artifact (before compiling) the static shared memory counts as none."""
        launch = {k: v for k, v in context.launch.items()
                  if k.startswith("block") or k == "shared_bytes"}
        if any(names_in(text) - set(params) for text in launch.values()):
            return  # depends on the sizes: checked per size in the worker
        shape = evaluate_launch({"grid_x": "1", **launch}, params)
        facts = self._profile.facts
        limit = int(float(facts.get("shared_memory_per_block_kib", 48)) * 1024)
        static = artifact.resources.get("shared_static_bytes", 0) if artifact else 0
        geometry_fits(shape, int(facts.get("max_threads_per_block", 1024)), int(static), limit)

    # ------------------------------------------------------------ run

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        """Validate at the check sizes and at the size, time, check again (another seed)."""
        self._device_info()
        return self._runner.evaluate(self._request(artifact, request, request.size), request)

    def _request(
        self, artifact: Artifact, request: EvalRequest, size: ProblemSize
    ) -> dict[str, Any]:
        tensor_map_boxes(request.context.launch, {**size.as_dict(), **request.params},
                         [arg.name for arg in request.spec.args if arg.kind == "buffer"])
        return evaluation_message(artifact, request, size)

    def time_vendor(
        self, spec: KernelSpec, dtype: str, size: ProblemSize, config: EvalConfig
    ) -> tuple[str, Measurement]:
        """cuBLAS (matmul), checked and timed like a variant, in the same worker."""
        return self._runner.time_vendor(spec, dtype, size, config, self.name)

    def close(self) -> None:
        self._runner.close()

    # ------------------------------------------------------------ compute-sanitizer

    def sanitize(self, artifact: Artifact, request: EvalRequest) -> str:
        """Run memcheck and racecheck on one validation at the smallest requested size.

        Returns the sanitizer's reports. Raises WrongResult naming the tool when either
        reports errors, else WrongResult or KernelCrash when the kernel failed under it.
        """
        tool = find_cuda_tool("compute-sanitizer")
        sizes = [*request.check_sizes, request.size]
        smallest = min(sizes, key=lambda s: float(evaluate(request.spec.flops, s.as_dict())))
        label = size_label(request.spec, smallest)
        runs: list[tuple[str, int, str]] = []
        with self._one_shot_request(artifact, request, smallest) as path:
            for check in ("memcheck", "racecheck"):
                runs.append((check, *_run_sanitizer(tool, check, path, label)))
        report = "\n".join(f"---- compute-sanitizer {check} at {label}: exit status {status}\n"
                           f"{text}" for check, status, text in runs)
        for check, status, text in runs:
            if status == _SANITIZER_ERRORS:
                raise WrongResult(f"compute-sanitizer {check} at {label}: {_finding(text)}",
                                  detail=report)
        for check, status, text in runs:
            if status == _WRONG_RESULT_STATUS:
                reason = [line for line in text.splitlines() if line.startswith("peak-tune: ")]
                raise WrongResult((reason or ["peak-tune: wrong result"])[-1][11:],
                                  detail=report)
            if status != 0:
                tail = text.strip().splitlines()[-1:] or [f"exit status {status}"]
                raise KernelCrash(f"kernel failed under compute-sanitizer {check}: {tail[0]}",
                                  detail=report)
        return "\n".join(f"compute-sanitizer {check} at {label}: no errors"
                         for check, _, _ in runs) + "\n" + report

    # ------------------------------------------------------------ Nsight Compute

    def profile(self, artifact: Artifact, request: EvalRequest) -> ProfileReport:
        """Nsight Compute's metrics for one launch of the variant at the timed size."""
        with self._one_shot_request(artifact, request, request.size) as path:
            return profile_request(path, WORKER_MODULE, request.context.entry, child_env())

    @contextlib.contextmanager
    def _one_shot_request(
        self, artifact: Artifact, request: EvalRequest, size: ProblemSize
    ) -> Iterator[Path]:
        """A request file for the one-shot worker (run under a CUDA tool): validate once
        at `size` only; removed afterwards."""
        message = self._request(artifact, request, size)
        message["check_sizes"] = []
        with tempfile.TemporaryDirectory(prefix="peak-tune-one-shot-") as folder:
            path = Path(folder) / "request.json"
            path.write_text(json.dumps(message))
            yield path


def _run_sanitizer(tool: str, check: str, request_path: Path, label: str) -> tuple[int, str]:
    """(exit status, output) of one sanitizer tool over the one-shot worker."""
    command = [tool, "--tool", check, "--error-exitcode", str(_SANITIZER_ERRORS),
               "--print-limit", "20", sys.executable, "-m", WORKER_MODULE, "--one-shot",
               str(request_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=_SANITIZER_TIMEOUT_S, env=child_env())
    except subprocess.TimeoutExpired as exc:
        raise KernelTimeout(f"compute-sanitizer {check} timed out at {label}") from exc
    return done.returncode, done.stdout + done.stderr


def _finding(report: str) -> str:
    """The sanitizer's first error line, without its '=========' prefix."""
    for line in report.splitlines():
        text = line.removeprefix("=========").strip()
        if line.startswith("=========") and re.match(r"(Invalid|Error|Race|.*hazard)", text):
            return text
    return "errors reported"


def profile_for_gpu(name: str, arch: str,
                    profiles: Iterable[DeviceProfile]) -> DeviceProfile | None:
    """The CUDA profile for a GPU called `name` with compute capability `arch` (sm_90):
    one whose name appears in the GPU's, else any of the same architecture."""
    same_arch = [p for p in profiles
                 if p.backend == "cuda" and str(p.facts.get("arch", "")).rstrip("a") == arch]
    named = [p for p in same_arch if p.name.upper() in name.upper()]
    candidates = named or same_arch
    return candidates[0] if candidates else None


def visible_gpu() -> tuple[str, str]:
    """(name, sm_XY) of device 0 as CuPy sees it."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return name, f"sm_{props['major']}{props['minor']}"
