"""The HIP backend: HIP kernels for AMD GPUs, and the same sources on NVIDIA GPUs.

One source language, two platforms (the reference applier prints HIP from the same
plans as CUDA: appliers/reference/cuda_matmul/dialect.py):

- AMD GPUs (profiles whose facts.arch is a gfx target: mi250, mi250x, mi300x):
  `HipBackend`. clang's HIP compiler builds a code object for the architecture
  (backends._hip_amd); the code object's resource usage (VGPRs, AGPRs, SGPRs, LDS,
  scratch, spills) prunes a point the device cannot run before anything runs. The GPU
  runtime is the CUDA backend's (backends._gpu_runner) on CuPy's ROCm build: the worker
  loads the code object through HIP's module API, times with HIP events and runs
  hipBLAS as the vendor, validating as on NVIDIA GPUs. It has not run on AMD hardware
  (none is lent to the project). Where ROCm shows no GPU of the profile's kind, probe()
  says so in one line and nothing else happens.
- NVIDIA GPUs (`--backend hip` with a CUDA profile, e.g. h200): `HipOnCudaBackend`.
  NVRTC builds the HIP source through peak-tune's own HIP-on-CUDA header
  (backends/hip_nvidia/hip/*.h: HIP's names mapped to CUDA's), and the CUDA backend's
  worker validates and times it beside cuBLAS. This runs every portable HIP kernel on
  real hardware here; wave64 and MFMA code cannot run on NVIDIA GPUs (it does not
  compile through the header, by design).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from peak_tune.backends import _hip_amd
from peak_tune.backends._amd_occupancy import occupancy
from peak_tune.backends._cuda_launch import check_launch, evaluate_launch, geometry_fits
from peak_tune.backends._files import built_or_reused
from peak_tune.backends._gpu_runner import GpuRunner, evaluation_message
from peak_tune.backends.base import Artifact, Capabilities, EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend
from peak_tune.backends.wire import macro_flags
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize, stable_hash
from peak_tune.errors import BackendUnavailable, InvalidPoint, UserError
from peak_tune.expr import names_in

__all__ = ["HIP_ON_CUDA_HEADERS", "HipBackend", "HipOnCudaBackend", "hip_on_cuda_version",
           "platform_of", "visible_amd_gpus"]

HIP_ON_CUDA_HEADERS = Path(__file__).with_name("hip_nvidia")
HARNESS_VERSION = "hip-1"
# dtype -> (DTYPE, ACC), as for CUDA: fp16 in and out with fp32 accumulation
_HIP_TYPES = {"float32": ("float", "float"), "float16": ("__half", "float"),
              "float64": ("double", "double")}
_KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")  # how ROCm's runtime finds GPUs
_AMD_UNAVAILABLE = ("the HIP backend runs on AMD GPUs through CuPy built for ROCm (a "
                    "cupy-rocm wheel, or CuPy built with CUPY_INSTALL_USE_HIP=1): {reason}")


def platform_of(profile: DeviceProfile) -> str:
    """"amd" for a gfx architecture, "nvidia" for an sm_ one, "" otherwise."""
    arch = str(profile.facts.get("arch", ""))
    return "amd" if arch.startswith("gfx") else "nvidia" if arch.startswith("sm_") else ""


@functools.cache
def hip_on_cuda_version() -> str:
    """The content hash of the HIP-on-CUDA headers (part of every build's key)."""
    digest = hashlib.sha256()
    for header in sorted(HIP_ON_CUDA_HEADERS.rglob("*.h")):
        digest.update(header.relative_to(HIP_ON_CUDA_HEADERS).as_posix().encode())
        digest.update(header.read_bytes())
    return digest.hexdigest()[:12]


class HipOnCudaBackend(CudaBackend):
    """Backend "hip" on an NVIDIA GPU: HIP sources, NVRTC through the HIP-on-CUDA
    header, the CUDA worker and cuBLAS (see the module docstring)."""

    name = "hip"
    capabilities = Capabilities(on_host=False, host_code=False, launch_region=True,
                                sanitizer=True, profiler=True)
    element_types = _HIP_TYPES  # the HIP sources' types (no bf16 here yet)

    def fingerprint(self) -> dict[str, str]:
        found = dict(super().fingerprint())
        found["compiler"] += f" + peak-tune HIP-on-CUDA headers {hip_on_cuda_version()}"
        return found

    def _language_defines(self) -> list[str]:
        return ["-D__HIP_PLATFORM_NVIDIA__=1"]

    def _language_includes(self) -> list[str]:
        return [str(HIP_ON_CUDA_HEADERS)]

    def _language_identity(self) -> dict[str, str]:
        return {"hip_on_cuda": hip_on_cuda_version()}


def visible_amd_gpus(nodes: Path | None = None) -> list[str]:
    """The gfx targets of the AMD GPUs the kernel driver shows (ROCm's KFD topology,
    `gfx_target_version` 90010 -> gfx90a); empty without one (or without the driver)."""
    found = []
    for properties in sorted((nodes or _KFD_NODES).glob("*/properties")):
        try:
            fields = dict(line.split()[:2] for line in properties.read_text().splitlines()
                          if len(line.split()) >= 2)
        except OSError:
            continue
        version = int(fields.get("gfx_target_version", "0") or 0)
        if version:  # CPU nodes have none
            major, minor, step = version // 10000, version // 100 % 100, version % 100
            found.append(f"gfx{major}{minor}{step:x}")
    return found


class HipBackend:
    """Backend "hip" on an AMD GPU (see the module docstring). Compiling needs clang with
    the amdgcn target and HIP's headers and device libraries, no GPU."""

    name = "hip"
    capabilities = Capabilities(on_host=False, host_code=False, launch_region=True)

    build_command = ("clang -x hip --offload-arch=<the device's gfx> --cuda-device-only -O3 "
                     "-std=c++17 (a code object)")

    @staticmethod
    def element_macros(dtype: str) -> dict[str, str]:
        """What a build of `dtype` defines besides the tuning values (see export)."""
        element, accumulator = _HIP_TYPES.get(dtype, ("", ""))
        return {"DTYPE": element, "ACC": accumulator} if element else {}

    def __init__(self, profile: DeviceProfile) -> None:
        if platform_of(profile) != "amd":
            raise UserError(f"device profile {profile.name!r} needs facts.arch like "
                            f"'gfx90a' for the HIP backend on AMD GPUs, not "
                            f"{profile.facts.get('arch', '')!r}")
        self._profile = profile
        self._arch = str(profile.facts["arch"])
        self._runner = GpuRunner(profile, _AMD_UNAVAILABLE, self._check_device)

    def __enter__(self) -> HipBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def probe(self) -> DeviceProfile:
        """The profile, once ROCm shows a GPU of its architecture and the GPU worker runs
        there; BackendUnavailable in one line otherwise."""
        self._require_visible_gpu()
        self._runner.info()
        return self._profile

    def _require_visible_gpu(self) -> None:
        """Before any process starts: ROCm's kernel driver shows a GPU of this kind."""
        gpus = visible_amd_gpus()
        if self._arch.split(":")[0] not in gpus:
            seen = f" (it shows {', '.join(sorted(set(gpus)))})" if gpus else ""
            raise BackendUnavailable(
                f"no AMD GPU of the {self._profile.name} kind ({self._arch}) is visible "
                f"here{seen}: run where ROCm sees one; `peak-tune dry-run --device "
                f"{self._profile.name}` compiles and checks the space here")

    def _check_device(self, info: Mapping[str, Any]) -> None:
        if info.get("platform") != "hip":
            raise BackendUnavailable(
                f"the GPU worker runs on {info.get('platform', 'cuda').upper()} "
                f"({info['name']}): CuPy here is not its ROCm build, which the "
                f"{self._profile.name} profile needs")
        found = str(info.get("arch", "")).split(":")[0]
        if found != self._arch.split(":")[0]:
            raise BackendUnavailable(
                f"the GPU HIP runs on is {info['name']} ({found}) but device profile "
                f"{self._profile.name!r} is for {self._arch}: choose the profile of this "
                "GPU with --device (or HIP_VISIBLE_DEVICES)")

    def fingerprint(self) -> Mapping[str, str]:
        toolchain = _hip_amd.find_toolchain()
        found = {"device": f"{self._profile.title} ({self._arch})",
                 "compiler": toolchain.version, "flags": f"-O3 --offload-arch={self._arch}",
                 "harness": HARNESS_VERSION}
        if self._arch.split(":")[0] in visible_amd_gpus():  # where it runs: its runtime
            info = self._runner.info()
            found["driver"] = f"amdgpu {info['driver'] or 'unknown'} (HIP {info['driver_cuda']})"
            found["runtime"] = f"HIP {info['runtime_cuda']} (cupy {info['cupy']})"
        return found

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        """<build_dir>/<key>.co for the profile's architecture (or an identical build
        reused); InvalidPoint for a point whose registers, LDS, spills or block the
        device cannot run (Artifact.resources holds them and the occupancy)."""
        if dtype not in _HIP_TYPES:
            raise UserError(f"the HIP backend supports dtypes {', '.join(_HIP_TYPES)}, "
                            f"not {dtype!r}")
        check_launch(context.launch, None)
        self._check_block(context, params, {})
        element, accumulator = _HIP_TYPES[dtype]
        macro_flags(params, {"DTYPE", "ACC"})  # CompileError for a bad name or value
        defines: dict[str, str | int] = {"DTYPE": element, "ACC": accumulator, **params}
        toolchain = _hip_amd.find_toolchain()
        key = stable_hash({"build": context.build_identity(), "arch": self._arch,
                           "defines": sorted(defines.items()), "clang": toolchain.version})

        def build(code_object: Path) -> tuple[str, dict[str, int]]:
            log = _hip_amd.compile_code_object(context.source, self._arch, defines,
                                               code_object, time_limit_s)
            resources = _hip_amd.kernel_resources(toolchain, code_object, context.entry)
            resources["occupancy_waves"] = occupancy(resources, self._arch)
            return log, resources

        artifact = built_or_reused(build_dir, key, ".co", build)
        self._check_block(context, params, artifact.resources)
        return artifact

    def _check_block(self, context: KernelContext, params: Mapping[str, int],
                     resources: Mapping[str, int]) -> None:
        """InvalidPoint for what this device cannot run: a block too large or past the
        kernel's own bound, LDS (static + dynamic) over the profile's, registers spilled
        to scratch, no wave per SIMD. Geometries that depend on the sizes are checked
        where the kernel runs."""
        facts = self._profile.facts
        launch = {k: v for k, v in context.launch.items()
                  if k.startswith("block") or k == "shared_bytes"}
        if any(names_in(text) - set(params) for text in launch.values()):
            return
        shape = evaluate_launch({"grid_x": "1", **launch}, params)
        lds_limit = int(float(facts.get("shared_memory_per_block_kib", 64)) * 1024)
        static = int(resources.get("lds_bytes", 0))
        geometry_fits(shape, int(facts.get("max_threads_per_block", 1024)), static, lds_limit)
        if not resources:
            return
        bound = int(resources["max_threads_per_block"])
        if shape.threads > bound:
            raise InvalidPoint(f"a block of {shape.threads} threads is over the kernel's "
                               f"bound of {bound} (__launch_bounds__)")
        spills = int(resources["vgpr_spills"]) + int(resources["sgpr_spills"])
        if spills:
            raise InvalidPoint(f"{spills} registers spilled to scratch on {self._arch} "
                               f"({resources['vgprs']} VGPRs, {resources['agprs']} AGPRs)")
        if int(resources["occupancy_waves"]) < 1:
            raise InvalidPoint(f"no wave fits a SIMD on {self._arch}")

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        """Validate at the check sizes and at the size, time, check again (another seed),
        in the GPU worker on ROCm."""
        self.probe()
        return self._runner.evaluate(evaluation_message(artifact, request, request.size),
                                     request)

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        """hipBLAS (matmul), checked and timed like a variant, in the same worker."""
        self.probe()
        return self._runner.time_vendor(spec, dtype, size, config, self.name)

    def close(self) -> None:
        self._runner.close()

