"""The HLSL backend: compute shaders compiled to SPIR-V and run through Vulkan.

The PEAK paper's third backend (there: DXC and a graphics API on a Qualcomm Adreno X1-85,
where no BLAS exists). A variant is HLSL with its tuning parameters as -D defines, built
by DXC or glslang into one SPIR-V module (backends._hlsl_compile; the compiler is part
of the build's key and of the fingerprint); the module's thread group and groupshared
bytes prune a point the device cannot run before anything is dispatched. A worker
process (backends._hlsl_worker) owns the Vulkan device, validates and times there; a
hang or a lost device ends only it. Any Vulkan device runs it: Mesa's lavapipe on a CPU
machine, NVIDIA's driver on the H200, AMD's or Qualcomm's on users' machines; the device
profile says which (facts.vulkan_device: a part of the device's name).

Launch geometry is data, as for CUDA: [launch.hlsl] grid_x/grid_y/grid_z expressions of
the sizes, the tuning parameters and the shader's own thread group (group_x, group_y,
group_z, read from the SPIR-V).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from peak_tune.backends._files import built_or_reused
from peak_tune.backends._gpu_runner import GpuRunner
from peak_tune.backends._hlsl_compile import (
    HlslCompiler,
    SpirvOptimizer,
    compile_spirv,
    find_compiler,
    find_optimizer,
)
from peak_tune.backends.base import Artifact, Capabilities, EvalConfig, EvalRequest
from peak_tune.backends.wire import (
    config_to_wire,
    macro_flags,
    spec_to_wire,
)
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize, stable_hash
from peak_tune.errors import (
    BackendUnavailable,
    InvalidPoint,
    NoVendorLibrary,
    UserError,
)
from peak_tune.evaluation.validation import applicable_sizes, require_size_constraints

__all__ = ["HARNESS_VERSION", "HlslBackend", "HlslOnCudaBackend"]

HARNESS_VERSION = "hlsl-2"  # bump when validation or timing in the worker changes
_WORKER_MODULE = "peak_tune.backends._hlsl_worker"
# dtype -> (DTYPE, ACC, 16-bit types on): fp16 is half in and out with fp32 accumulation,
# in buffers of the device's 16-bit storage
_HLSL_TYPES = {"float32": ("float", "float", False), "float16": ("half", "float", True)}
_UNAVAILABLE = ("the HLSL backend needs a Vulkan driver and the vulkan package: pip "
                "install 'peak-tune[hlsl]' and a driver (Debian: mesa-vulkan-drivers for "
                "lavapipe on the CPU) ({reason})")


class HlslBackend:
    """Backend "hlsl": see the module docstring. Construct with a DeviceProfile."""

    name = "hlsl"
    capabilities = Capabilities(on_host=False, host_code=False, launch_region=True,
                                vendor_library=False, bounded_buffers=True)

    build_command = ("DXC, else glslang (-D -V, HLSL to SPIR-V), then spirv-opt -O where "
                     "installed, or Slang for cooperative matrices: a Vulkan compute shader")

    @staticmethod
    def element_macros(dtype: str) -> dict[str, str]:
        """What a build of `dtype` defines besides the tuning values (see export)."""
        element, accumulator, _ = _HLSL_TYPES.get(dtype, ("", "", False))
        return {"DTYPE": element, "ACC": accumulator} if element else {}

    def __init__(self, profile: DeviceProfile) -> None:
        self._profile = profile
        self._runner = GpuRunner(profile, _UNAVAILABLE, self._check_device, _WORKER_MODULE,
                                 package="vulkan")

    def __enter__(self) -> HlslBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ device

    def probe(self) -> DeviceProfile:
        self._runner.info()
        return self._profile

    def _check_device(self, info: Mapping[str, Any]) -> None:
        if not info.get("robust"):  # capabilities.bounded_buffers rests on it
            raise BackendUnavailable(
                f"the Vulkan device {info['name']} offers no robust buffer access "
                "(robustBufferAccess): a shader's writes past its buffers could reach other "
                "memory, and no shader is run without it")
        wanted = str(self._profile.facts.get("vulkan_device", ""))
        if wanted and wanted.lower() not in str(info["name"]).lower():
            raise BackendUnavailable(
                f"no Vulkan device of the {self._profile.name} kind ({wanted}) here: the "
                f"first Vulkan device is {info['name']}; choose its profile with --device")

    def fingerprint(self) -> Mapping[str, str]:
        info = self._runner.info()
        compiler = find_compiler(self._compiler_choice())
        optimizer = self._optimizer(compiler)
        return {"device": str(info["name"]), "driver": str(info["driver"]),
                "compiler": compiler.label,
                "optimizer": optimizer.label if optimizer else "none",
                "harness": HARNESS_VERSION}

    def _compiler_choice(self) -> str:
        return str(self._profile.facts.get("hlsl_compiler", "auto"))

    def _optimizer(self, compiler: HlslCompiler) -> SpirvOptimizer | None:
        """spirv-opt for DXC's and glslang's modules, unless the profile's `spirv_opt`
        is "off" (Slang optimises its own)."""
        wanted = str(self._profile.facts.get("spirv_opt", "auto"))
        return None if compiler.name == "slang" else find_optimizer(wanted)

    # ------------------------------------------------------------ compile

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        """<build_dir>/<key>.spv (or an identical build reused); InvalidPoint for a
        thread group or groupshared memory over the device's limits."""
        if dtype not in _HLSL_TYPES:
            raise UserError(f"the HLSL backend supports dtypes {', '.join(_HLSL_TYPES)}, "
                            f"not {dtype!r}")
        element, accumulator, sixteen_bit = _HLSL_TYPES[dtype]
        macro_flags(params, {"DTYPE", "ACC", "PT_WAVE_SIZE"})  # CompileError: bad name, value
        # PT_WAVE_SIZE: the subgroup size, for shaders that arrange their threads by wave
        defines: dict[str, str | int] = {"DTYPE": element, "ACC": accumulator,
                                         "PT_WAVE_SIZE": self._profile.wave_size, **params}
        compiler = find_compiler(self._compiler_choice(), context.source)
        optimizer = self._optimizer(compiler)
        key = stable_hash({"build": context.build_identity(), "defines": sorted(
            defines.items()), "compiler": compiler.label,
            "optimizer": optimizer.label if optimizer else "none", "harness": HARNESS_VERSION})

        def build(path: Any) -> tuple[str, dict[str, int]]:
            log, found = compile_spirv(compiler, context.source, defines, path,
                                       time_limit_s, sixteen_bit, optimizer)
            x, y, z = found.local_size
            return log, {"group_x": x, "group_y": y, "group_z": z, "threads": found.threads,
                         "shared_bytes": found.shared_bytes,
                         "cooperative_matrix": int("CooperativeMatrixKHR"
                                                   in found.capabilities),
                         "workgroup_matrix": int(found.workgroup_matrices),
                         "tensor_addressing": int("TensorAddressingNV" in found.capabilities)}

        artifact = built_or_reused(build_dir, key, ".spv", build)
        self._check_limits(artifact.resources)
        return artifact

    def _check_limits(self, resources: Mapping[str, int]) -> None:
        facts = self._profile.facts
        threads, shared = int(resources["threads"]), int(resources["shared_bytes"])
        limit = int(facts.get("max_threads_per_group", 1024))
        if threads > limit:
            raise InvalidPoint(f"a thread group of {threads} is over the device's {limit}")
        shared_limit = int(float(facts.get("groupshared_kib", 32)) * 1024)
        if shared > shared_limit:
            raise InvalidPoint(f"{shared} bytes of groupshared memory are over the device's "
                               f"{shared_limit}")

    # ------------------------------------------------------------ run

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        """Validate at the check sizes and at the size, then time there (every run on
        fresh inputs and checked), in the Vulkan worker."""
        context, params = request.context, request.params
        require_size_constraints(context, params, request.size)
        if request.dtype == "float16" and not self._runner.info().get("storage16"):
            raise BackendUnavailable(f"{self._runner.info()['name']} has no 16-bit storage "
                                     "buffers (storageBuffer16BitAccess): no fp16 here")
        resources = artifact.resources
        if resources.get("cooperative_matrix") and \
                not self._runner.info().get("cooperative_matrix"):
            raise InvalidPoint(f"the shader uses cooperative matrices, which "
                               f"{self._runner.info()['name']} does not expose "
                               "(VK_KHR_cooperative_matrix)")
        if resources.get("workgroup_matrix") and \
                not self._runner.info().get("workgroup_matrix"):
            raise InvalidPoint(f"the shader uses cooperative matrices of a whole thread "
                               f"group, which {self._runner.info()['name']} does not expose "
                               "(VK_NV_cooperative_matrix2's workgroup scope)")
        if resources.get("tensor_addressing") and \
                not self._runner.info().get("tensor_addressing"):
            raise InvalidPoint(f"the shader loads cooperative matrices through tensor layouts, "
                               f"which {self._runner.info()['name']} does not expose "
                               "(VK_NV_cooperative_matrix2's tensor addressing)")
        message = {
            "op": "evaluate", "spirv": artifact.path, "launch": dict(context.launch),
            "params": dict(params),
            "group": {k: int(resources[k]) for k in ("group_x", "group_y", "group_z")},
            "spec": spec_to_wire(request.spec), "dtype": request.dtype,
            "size": request.size.as_dict(),
            "check_sizes": [s.as_dict() for s in applicable_sizes(context, params,
                                                                  request.check_sizes)],
            "config": config_to_wire(request.config),
        }
        return self._runner.evaluate(message, request)

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        peak = float(self._profile.peak_gflops.get(dtype, 0.0) or 0.0)
        against = (f"the ratio is to its documented peak, {peak:.0f} GFLOP/s" if peak
                   else "it documents no peak either: GFLOP/s alone")
        raise NoVendorLibrary(f"no BLAS for Vulkan compute on {self._profile.title}; "
                              f"{against}")

    def close(self) -> None:
        self._runner.close()


class HlslOnCudaBackend(HlslBackend):
    """HLSL through Vulkan on an NVIDIA GPU whose profile is the CUDA backend's
    (`--backend hlsl --device h200`): the shaders run as on any Vulkan device, and
    cuBLAS, timed by the CUDA backend's worker on the same GPU, is the vendor beside
    them (the summary gives the documented peak's ratio too)."""

    capabilities = dataclasses.replace(HlslBackend.capabilities, vendor_library=True)

    def __init__(self, profile: DeviceProfile) -> None:
        super().__init__(profile)
        self._cuda: Any = None

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        if self._cuda is None:
            from peak_tune.backends.cuda import CudaBackend

            self._cuda = CudaBackend(self._profile)
        found: tuple[str, Measurement] = self._cuda.time_vendor(spec, dtype, size, config)
        return found

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._cuda is not None:
                self._cuda.close()
