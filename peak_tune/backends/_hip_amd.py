"""The AMD side of the HIP backend's toolchain: compile HIP device code for gfx90a (MI200)
and gfx942 (MI300X) with clang, read each kernel's registers, LDS and spills from the code
object's metadata and disassemble it (_amd_occupancy bounds its occupancy). Nothing needs an AMD GPU
or launches a kernel: compile-time facts only, so a search can prune a point before any
device time is spent on it.

Debian 12 serves the whole toolchain (`apt-get install clang-19 lld-19 llvm-19
libamdhip64-dev rocm-device-libs`); a ROCm install's own clang is preferred where there is
one. Debian's device libraries lack gfx942's ISA-version file, which is made once per user
(device_library_folder).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from peak_tune.atomic_files import put_atomically, write_atomically

# c.py's helpers for running a compiler in a process group of its own, killing the whole
# group at a time limit, and reading the machine's faults in a failed build's log.
from peak_tune.backends._compiler import run_compiler
from peak_tune.core import stable_hash
from peak_tune.errors import (
    COMPILER_KILLED,
    OUT_OF_MEMORY,
    BackendUnavailable,
    CompileError,
    UserError,
    environment_fault,
)

__all__ = [
    "HANG_LIMIT_S",
    "AmdToolchain",
    "compile_code_object",
    "device_library_folder",
    "disassemble",
    "find_toolchain",
    "isa_version_number",
    "kernel_resources",
    "matrix_instructions",
    "target_id",
]

_log = logging.getLogger(__name__)

HANG_LIMIT_S = 300.0  # a compile with no build budget is stopped here as hung
_DEBIAN_PACKAGES = "clang-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs"
_INSTALL = f"install {_DEBIAN_PACKAGES} (Debian 12: apt-get install {_DEBIAN_PACKAGES})"
_MIN_CLANG = 17  # the oldest clang that names gfx942
_CLANG_NAMES = ("clang++-19", "clang++", "clang++-20", "clang++-21", "clang++-22",
                "clang++-18", "clang++-17")
_TOOL_TIMEOUT_S = 60.0
_CLANG_VERSION = re.compile(r"clang version (\d+)\.")
# A target ID: processor gfx<major><minor><stepping> (minor and stepping one hex digit
# each), then optional features (gfx90a:xnack-).
_TARGET_ID = re.compile(r"^(gfx(\d+)([0-9a-f])([0-9a-f]))((?::[a-z0-9-]+[+-])*)$")
_ISA_CONSTANT = r"(@__oclc_ISA_version = [^\n]*constant i32 ){number}\b"
_METADATA = re.compile(r"^[ \t]*---[ \t]*\n(.*?)^[ \t]*\.\.\.[ \t]*$", re.MULTILINE | re.DOTALL)
_MATRIX_MNEMONIC = re.compile(r"^\s+(v_(?:mfma|smfmac)_[0-9a-z_]+)", re.MULTILINE)
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# What clang prints when the machine, not the source, ended a build (c.py's table holds
# gcc's words and the system's): the driver's line when cc1 was killed (by the
# out-of-memory killer, or from outside), LLVM's when an allocation failed. Anchored to
# the driver's own name, so that a kernel's `#error` with these words is not read as one.
_CLANG_FAULTS = (
    (re.compile(r"^[^\s:]*clang[^\s:]*: error: unable to execute command: "
                r"(?:Killed|Terminated)$"), COMPILER_KILLED),
    (re.compile(r"^LLVM ERROR: out of memory"), OUT_OF_MEMORY),
)

# The metadata field behind each resource, and its value when the field is absent (None:
# required). AMDGPUUsage, "Code Object V3+ Metadata": .agpr_count exists only for targets
# with AGPRs, the spill counts only where LLVM wrote them.
_RESOURCE_FIELDS: Mapping[str, tuple[str, int | None]] = {
    "vgprs": (".vgpr_count", None),
    "agprs": (".agpr_count", 0),
    "sgprs": (".sgpr_count", None),
    "vgpr_spills": (".vgpr_spill_count", 0),
    "sgpr_spills": (".sgpr_spill_count", 0),
    "lds_bytes": (".group_segment_fixed_size", None),
    "scratch_bytes": (".private_segment_fixed_size", None),
    "wavefront_size": (".wavefront_size", None),
    "max_threads_per_block": (".max_flat_workgroup_size", None),
}


@dataclass(frozen=True)
class AmdToolchain:
    """A clang that targets amdgcn, the LLVM tools of the same release, and the HIP
    headers and device libraries it compiles against."""

    clang: Path  # clang++
    readelf: Path  # llvm-readelf: the code object's AMDGPU metadata note
    objdump: Path  # llvm-objdump: disassembly
    llvm_dis: Path  # llvm-dis and llvm-as: to make a missing ISA-version bitcode file
    llvm_as: Path
    version: str  # first line of `clang++ --version`
    rocm_path: Path  # --rocm-path: holds include/hip/hip_runtime.h
    device_libs: Path  # the installed device libraries (ockl.bc, oclc_*.bc)
    processors: frozenset[str]  # the gfx processors this clang can target


# ------------------------------------------------------------------ toolchain


@functools.cache
def find_toolchain() -> AmdToolchain:
    """The first clang++ >= 17 that names amdgcn: ROCm's ($ROCM_PATH, else /opt/rocm,
    under llvm/bin: the compiler that ROCm's runtime was built with), else clang++-19,
    clang++ or another release on PATH. BackendUnavailable, naming the Debian packages,
    when none is found or its headers or device libraries are missing."""
    rocm = Path(os.environ.get("ROCM_PATH") or "/opt/rocm")
    candidates = [rocm / "llvm" / "bin" / "clang++"]
    candidates += [Path(found) for found in map(shutil.which, _CLANG_NAMES) if found]
    rejected = []
    for clang in dict.fromkeys(candidates):  # in order, once each
        if not clang.is_file():
            continue
        version, major = _version_of(clang)
        processors = _processors_of(clang) if major >= _MIN_CLANG else frozenset()
        if not processors:
            rejected.append(f"{clang} is {version or 'not clang'}" if major < _MIN_CLANG
                            else f"{clang} has no amdgcn target")
            continue
        rocm_path = rocm if clang.is_relative_to(rocm) else Path("/usr")
        return _toolchain_of(clang, rocm_path, version, major, processors)
    tried = f" ({'; '.join(rejected)})" if rejected else ""
    raise BackendUnavailable(f"no clang++ >= {_MIN_CLANG} that targets AMD GPUs{tried}: "
                             f"{_INSTALL}, or set ROCM_PATH")


def _version_of(clang: Path) -> tuple[str, int]:
    """The first line of `clang --version` and its major release; ("", 0) if not clang."""
    version = (_tool_output([str(clang), "--version"]).splitlines() or [""])[0]
    found = _CLANG_VERSION.search(version)
    return version, int(found.group(1)) if found else 0


def _toolchain_of(clang: Path, rocm_path: Path, version: str, major: int,
                  processors: frozenset[str]) -> AmdToolchain:
    """`clang` with its LLVM tools (beside its real path, else `<tool>-<major>` on PATH),
    the HIP headers under `rocm_path` and the device libraries."""
    home = Path(os.path.realpath(clang)).parent
    tools = {name: _llvm_tool(home, name, major)
             for name in ("llvm-readelf", "llvm-objdump", "llvm-dis", "llvm-as", "ld.lld")}
    if not (rocm_path / "include" / "hip" / "hip_runtime.h").is_file():
        raise BackendUnavailable(f"no HIP headers under {rocm_path}/include/hip: {_INSTALL}")
    return AmdToolchain(clang, tools["llvm-readelf"], tools["llvm-objdump"],
                        tools["llvm-dis"], tools["llvm-as"], version, rocm_path,
                        _installed_device_libs(rocm_path), processors)


def _llvm_tool(home: Path, name: str, major: int) -> Path:
    beside = home / name
    if beside.is_file():
        return beside
    found = shutil.which(f"{name}-{major}")
    if found is None:
        raise BackendUnavailable(f"no {name} beside {home}/clang nor {name}-{major} on "
                                 f"PATH: {_INSTALL}")
    return Path(found)


def _installed_device_libs(rocm_path: Path) -> Path:
    """The folder of ockl.bc and the oclc_*.bc files: ROCm's (amdgcn/bitcode, or inside its
    LLVM from ROCm 6.2) or Debian's multiarch one (/usr/lib/<triplet>/amdgcn/bitcode)."""
    patterns = ("amdgcn/bitcode", "llvm/lib/clang/*/lib/amdgcn/bitcode",
                "lib/*/amdgcn/bitcode", "lib/amdgcn/bitcode")
    for pattern in patterns:
        for folder in sorted(rocm_path.glob(pattern)):
            if (folder / "ockl.bc").is_file():
                return folder
    raise BackendUnavailable(f"no AMD GPU device libraries (ockl.bc) under {rocm_path}: "
                             f"{_INSTALL}")


def _processors_of(clang: Path) -> frozenset[str]:
    """The gfx processors `clang` can target (none: it was built without AMDGPU)."""
    listing = _tool_output([str(clang), "--target=amdgcn-amd-amdhsa", "-nogpulib",
                            "-print-supported-cpus"], with_stderr=True)  # it prints there
    return frozenset(word for word in listing.split() if _TARGET_ID.match(word))


def _tool_output(command: list[str], with_stderr: bool = False) -> str:
    """stdout (and stderr) of a quick tool run; "" when it cannot run or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=_TOOL_TIMEOUT_S, env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if done.returncode != 0:
        return ""
    return done.stdout + done.stderr if with_stderr else done.stdout


# ------------------------------------------------------------------ device libraries


def isa_version_number(arch: str) -> int:
    """The `__oclc_ISA_version` constant of `arch`'s device library: major * 1000 + minor
    * 100 + stepping, minor and stepping being the last two hex digits of the processor
    name (gfx942 -> 9402, gfx90a -> 9010, gfx90c -> 9012, gfx1030 -> 10300), the rule that
    every oclc_isa_version_<N>.bc of rocm-device-libs follows."""
    found = target_id(arch)
    return int(found.group(2)) * 1000 + int(found.group(3), 16) * 100 + int(found.group(4), 16)


def device_library_folder(toolchain: AmdToolchain, arch: str) -> Path:
    """The folder to pass as --rocm-device-lib-path for `arch`: the installed one when it
    has oclc_isa_version_<N>.bc for the processor, else a per-user cache folder of links
    to the installed files plus that file, made from another of the same major version
    (they define nothing but the constant isa_version_number gives)."""
    processor = _processor(toolchain, arch)
    if (toolchain.device_libs / _isa_file(processor)).is_file():
        return toolchain.device_libs
    template = _isa_template(toolchain.device_libs, processor)
    stat = template.stat()
    key = stable_hash([str(toolchain.device_libs), toolchain.version, template.name,
                       stat.st_size, stat.st_mtime_ns])[:16]
    folder = _cache_root() / "hip-device-libs" / f"{processor}-{key}"
    if not (folder / _isa_file(processor)).is_file():
        _make_library_folder(toolchain, template, processor, folder)
    return folder


def _make_library_folder(toolchain: AmdToolchain, template: Path, processor: str,
                         folder: Path) -> None:
    """Fill a temporary folder beside `folder`, then rename it to `folder`: two processes
    at once never see half a folder; the one that renames second finds `folder` there,
    drops its own copy and uses the first one's."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:
        raise _cache_failure(exc, folder) from exc
    try:
        for library in sorted(toolchain.device_libs.glob("*.bc")):
            (staging / library.name).symlink_to(library)
        _write_isa_file(toolchain, template, processor, staging / _isa_file(processor))
        os.rename(staging, folder)
        _log.info("made %s's device libraries in %s", processor, folder)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if (folder / _isa_file(processor)).is_file():
            return  # another process renamed its copy first
        raise _cache_failure(exc, folder) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _cache_failure(error: OSError, folder: Path) -> Exception:
    """A full disk is the machine's fault; any other failure (a read-only home) the
    user's to fix."""
    return environment_fault(error, f"making {folder}") or BackendUnavailable(
        f"cannot make {folder}: {error.strerror or error}; set XDG_CACHE_HOME to a writable "
        "folder")


def _write_isa_file(toolchain: AmdToolchain, template: Path, processor: str,
                    target: Path) -> None:
    """`template` with its ISA-version constant replaced by `processor`'s, to `target`."""
    text = _tool_output([str(toolchain.llvm_dis), str(template), "-o", "-"])
    if not text:
        raise BackendUnavailable(f"{toolchain.llvm_dis} cannot read {template}")
    pattern = re.compile(_ISA_CONSTANT.format(number=isa_version_number(_arch_of(template))))
    edited, count = pattern.subn(rf"\g<1>{isa_version_number(processor)}", text)
    if count != 1:
        raise BackendUnavailable(f"{template} does not define __oclc_ISA_version as its "
                                 f"name says: cannot make {processor}'s device library")
    done = subprocess.run([str(toolchain.llvm_as), "-", "-o", str(target)], input=edited,
                          capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise BackendUnavailable(f"{toolchain.llvm_as} cannot write {target.name}: "
                                 f"{done.stderr.strip()}")


def _isa_template(device_libs: Path, processor: str) -> Path:
    """The installed ISA-version file nearest `processor` in its major version (gfx940's
    for gfx942)."""
    major, number = target_id(processor).group(2), isa_version_number(processor)
    same_major = [path for path in device_libs.glob("oclc_isa_version_*.bc")
                  if (found := _TARGET_ID.match(_arch_of(path))) and found.group(2) == major]
    if not same_major:
        raise BackendUnavailable(f"{device_libs} has no gfx{major} ISA-version file to make "
                                 f"{processor}'s from: a newer rocm-device-libs or ROCm is "
                                 "needed")
    return min(same_major, key=lambda path: abs(isa_version_number(_arch_of(path)) - number))


def _isa_file(processor: str) -> str:
    return f"oclc_isa_version_{processor.removeprefix('gfx')}.bc"


def _arch_of(isa_file: Path) -> str:
    return "gfx" + isa_file.stem.removeprefix("oclc_isa_version_")


def _cache_root() -> Path:
    """$XDG_CACHE_HOME/peak-tune, else ~/.cache/peak-tune (the XDG base directory rule:
    a relative XDG_CACHE_HOME is ignored)."""
    chosen = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(chosen) if chosen and Path(chosen).is_absolute() else Path.home() / ".cache"
    return base / "peak-tune"


def target_id(arch: str) -> re.Match[str]:
    found = _TARGET_ID.match(arch)
    if found is None:
        raise UserError(f"{arch!r} is not an AMD GPU target ID such as gfx90a, gfx942 or "
                        "gfx90a:xnack-")
    return found


def _processor(toolchain: AmdToolchain, arch: str) -> str:
    """The processor of target ID `arch`, which `toolchain` must know."""
    processor = target_id(arch).group(1)
    if processor not in toolchain.processors:
        raise BackendUnavailable(f"{toolchain.version} cannot target {processor}: a newer "
                                 "clang or ROCm's is needed")
    return processor


# ------------------------------------------------------------------ compile


def compile_code_object(source: str, arch: str, defines: Mapping[str, str | int], out: Path,
                        time_limit_s: float) -> str:
    """Compile HIP `source` (written to `out` with suffix .hip) to the code object `out`
    for target ID `arch`; the compiler's log. `out` appears whole or not at all.
    CompileError with the log for a source clang rejects; BuildOverBudget past a
    `time_limit_s` under HANG_LIMIT_S (0: no budget, only the hang limit); EnvironmentFault
    when the disk or memory ran out or clang was killed."""
    toolchain = find_toolchain()
    libraries = device_library_folder(toolchain, arch)
    out = out.absolute()
    source_path = out.with_suffix(".hip")
    write_atomically(source_path, source)
    command = [str(toolchain.clang), "-x", "hip", f"--offload-arch={arch}",
               "--cuda-device-only", "--no-gpu-bundle-output", "-O3", "-std=c++17",
               f"--rocm-path={toolchain.rocm_path}", f"--rocm-device-lib-path={libraries}",
               "-fno-crash-diagnostics",  # no preprocessed copy in /tmp when cc1 dies
               *_define_flags(defines), str(source_path)]
    logs: list[str] = []
    try:
        # clang's intermediate object goes to $TMPDIR: a folder removed afterwards, so a
        # compile killed at its limit leaves nothing behind
        with tempfile.TemporaryDirectory(prefix=".peak-tune-hip-", dir=out.parent,
                                         ignore_cleanup_errors=True) as scratch:
            def build(temporary: Path) -> None:
                try:
                    logs.append(run_compiler(
                        [*command, "-o", str(temporary)], time_limit_s,
                        hang_limit_s=HANG_LIMIT_S, env={"TMPDIR": scratch},
                        faults=_CLANG_FAULTS))
                except BaseException:
                    temporary.unlink(missing_ok=True)
                    raise
            put_atomically(out, build)
    except OSError as exc:  # the scratch folder itself (a full disk)
        fault = environment_fault(exc, f"building {out.name} in {out.parent}")
        if fault is None:
            raise
        raise fault from exc
    return logs[0]


def _define_flags(defines: Mapping[str, str | int]) -> list[str]:
    """`-DNAME=VALUE` for each define; CompileError for a name that is not a macro's."""
    flags = []
    for name, value in sorted(defines.items()):
        if not _MACRO_NAME.match(name) or isinstance(value, bool):
            raise CompileError(f"compile error: cannot define {name!r} as {value!r}")
        flags.append(f"-D{name}={value}")
    return flags


# ------------------------------------------------------------------ reading a code object


def kernel_resources(toolchain: AmdToolchain, code_object: Path, entry: str
                     ) -> dict[str, int]:
    """The registers, LDS and scratch of kernel `entry`, from the code object's AMDGPU
    metadata note (AMDGPUUsage, "Code Object V3+ Metadata"): vgprs (on gfx90a and gfx942
    arch VGPRs and AGPRs together, as the unified file allocates them), agprs, sgprs,
    vgpr_spills, sgpr_spills, lds_bytes (static LDS per workgroup), scratch_bytes (per
    lane), wavefront_size, max_threads_per_block. CompileError when `entry` is not there."""
    kernels = _metadata(toolchain, code_object).get("amdhsa.kernels") or []
    for kernel in kernels:
        if kernel.get(".name") == entry:
            return {key: _count(kernel, field, default, code_object)
                    for key, (field, default) in _RESOURCE_FIELDS.items()}
    names = ", ".join(str(kernel.get(".name")) for kernel in kernels) or "none"
    raise CompileError(f"compile error: no kernel {entry!r} in {code_object.name} "
                       f"(kernels found: {names})")


def disassemble(toolchain: AmdToolchain, code_object: Path, arch: str) -> str:
    """llvm-objdump's disassembly of `code_object`, decoded as `arch`'s instructions. The
    code object must hold code for `arch`: decoded as another processor's, the same bytes
    read as other mnemonics (gfx942's v_mfma_f32_32x32x8_f16 as gfx90a's ..._32x32x8f16)."""
    processor = target_id(arch).group(1)
    target = str(_metadata(toolchain, code_object).get("amdhsa.target", ""))
    built_for = target.rpartition("--")[2].partition(":")[0]
    if built_for != processor:
        raise UserError(f"{code_object.name} holds code for {built_for or 'no known GPU'}, "
                        f"not {processor}")
    text = _tool_output([str(toolchain.objdump), "-d", f"--mcpu={processor}",
                         str(code_object)])
    if not text:
        raise BackendUnavailable(f"{toolchain.objdump} cannot disassemble {code_object}")
    return text


def matrix_instructions(disassembly: str) -> list[str]:
    """The distinct matrix-core mnemonics in `disassembly`, sorted: v_mfma_* (gfx908 on)
    and gfx940's sparse v_smfmac_*. None: the kernel never uses the matrix cores."""
    return sorted(set(_MATRIX_MNEMONIC.findall(disassembly)))


def _metadata(toolchain: AmdToolchain, code_object: Path) -> dict[str, Any]:
    """The AMDGPU metadata note, which llvm-readelf prints as YAML between --- and ...
    Read with PyYAML's BaseLoader: every scalar a string, so a kernel named `on` or `0x10`
    stays a name (YAML 1.1 would make it a bool or a number)."""
    if not code_object.is_file():
        raise CompileError(f"compile error: no code object {code_object}")
    text = _tool_output([str(toolchain.readelf), "--notes", str(code_object)])
    documents = _METADATA.findall(text)
    if not documents:
        raise CompileError(f"compile error: {code_object.name} has no AMDGPU metadata note "
                           "(not a code object?)")
    merged: dict[str, Any] = {}
    for document in documents:
        try:
            loaded = yaml.load(document, Loader=yaml.BaseLoader)
        except yaml.YAMLError as exc:
            raise BackendUnavailable(f"cannot read the metadata {toolchain.readelf} printed "
                                     f"for {code_object.name}: {exc}") from exc
        merged.update(loaded if isinstance(loaded, dict) else {})
    return merged


def _count(kernel: Mapping[str, Any], field: str, default: int | None, code_object: Path
           ) -> int:
    value = kernel.get(field)
    if value is None and default is not None:
        return default
    if isinstance(value, str) and value.isdigit():  # BaseLoader: scalars are strings
        return int(value)
    raise BackendUnavailable(f"{code_object.name}: kernel metadata field {field} is "
                             f"{value!r}, not a count (an unknown code object version?)")
