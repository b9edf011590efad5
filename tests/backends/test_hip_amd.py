"""The AMD side of the HIP toolchain for real: clang compiles for gfx90a and gfx942 on a
machine with no AMD GPU, and what a search would read of a code object (registers, LDS,
spills, matrix instructions, occupancy) is checked against what the compiler itself says.

Skipped as a whole where no suitable clang is installed (the reason names the packages).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from peak_tune.backends._amd_occupancy import occupancy
from peak_tune.backends._hip_amd import (
    compile_code_object,
    device_library_folder,
    disassemble,
    find_toolchain,
    isa_version_number,
    kernel_resources,
    matrix_instructions,
)
from peak_tune.errors import (
    COMPILER_KILLED,
    BackendUnavailable,
    BuildOverBudget,
    CompileError,
    EnvironmentFault,
    UserError,
)

pytestmark = pytest.mark.hip

try:
    TOOLCHAIN = find_toolchain()
except BackendUnavailable as exc:
    pytest.skip(reason=f"needs clang for AMD GPUs: {exc}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hip"
SEED = (ROOT / "seeds" / "matmul" / "naive.hip").read_text()
ARCHS = ("gfx90a", "gfx942")
DTYPES: tuple[dict[str, str | int], ...] = ({"DTYPE": "float", "ACC": "float"},
                                            {"DTYPE": "__half", "ACC": "float"})

LDS_SOURCE = """\
#include <hip/hip_runtime.h>
extern "C" __global__ void __launch_bounds__(256) staged(const float *in, float *out, int n) {
    __shared__ float tile[LDS_FLOATS];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = threadIdx.x; j < LDS_FLOATS; j += blockDim.x) tile[j] = in[(i + j) % n];
    __syncthreads();
    out[i] = tile[(threadIdx.x * 7) % LDS_FLOATS];
}
"""

# NACC accumulators live at once: registers grow with NACC, occupancy falls
WIDE_SOURCE = """\
#include <hip/hip_runtime.h>
extern "C" __global__ void __launch_bounds__(256) wide(const float *a, float *out, int n) {
    float acc[NACC];
#pragma unroll
    for (int j = 0; j < NACC; j++) acc[j] = 0.0f;
    for (int k = 0; k < n; k++) {
        float x = a[k * 256 + threadIdx.x];
#pragma unroll
        for (int j = 0; j < NACC; j++) acc[j] = acc[j] * x + (float)j;
    }
#pragma unroll
    for (int j = 0; j < NACC; j++) out[j * 256 + threadIdx.x] = acc[j];
}
"""

# A private array indexed by a value known only at run time cannot live in registers
SPILL_SOURCE = """\
#include <hip/hip_runtime.h>
extern "C" __global__ void lookup(const int *index, float *out) {
    float local[1024];
    for (int j = 0; j < 1024; j++) local[j] = out[j * 3 + threadIdx.x];
    out[threadIdx.x] = local[index[threadIdx.x] & 1023];
}
"""

SYNTAX_ERROR_SOURCE = """\
#include <hip/hip_runtime.h>

extern "C" __global__ void broken(float *out) {
    float x = out[threadIdx.x]
    out[threadIdx.x] = x * 2.0f;
}
"""


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test makes gfx942's device library folder in a cache of its own."""
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def build(tmp_path: Path, source: str, arch: str, defines: dict[str, str | int] | None = None,
          name: str = "kernel", time_limit_s: float = 0.0) -> Path:
    out = tmp_path / "build" / f"{name}-{arch}.co"
    compile_code_object(source, arch, defines or {}, out, time_limit_s)
    return out


def llvm_occupancy(tmp_path: Path, source: str, arch: str, defines: dict[str, str | int]
                   ) -> int:
    """The occupancy LLVM itself computes for the kernel (the `; Occupancy:` line of its
    assembly), to check occupancy() against."""
    path = tmp_path / f"occupancy-{arch}.hip"
    path.write_text(source)
    done = subprocess.run(
        [str(TOOLCHAIN.clang), "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only",
         "-O3", "-std=c++17", f"--rocm-path={TOOLCHAIN.rocm_path}",
         f"--rocm-device-lib-path={device_library_folder(TOOLCHAIN, arch)}",
         *(f"-D{k}={v}" for k, v in defines.items()), "-S", "-o", "-", str(path)],
        capture_output=True, text=True, check=True)
    found = re.search(r"; Occupancy: (\d+)", done.stdout)
    assert found, done.stdout[-2000:]
    return int(found.group(1))


def running(pattern: str) -> list[str]:
    """Processes whose command line matches `pattern` (pgrep -f), as 'pid command'."""
    done = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True,
                          check=False)
    return done.stdout.splitlines()


# ------------------------------------------------------------------ the seed


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("defines", DTYPES, ids=("float", "half"))
def test_seed_compiles_and_its_resources_are_plausible(tmp_path: Path, arch: str,
                                                       defines: dict[str, str | int]) -> None:
    started = time.perf_counter()
    out = build(tmp_path, SEED, arch, defines, name="naive")
    print(f"{arch} {defines['DTYPE']}: {time.perf_counter() - started:.2f} s")
    assert out.with_suffix(".hip").read_text() == SEED  # the source, next to the object
    resources = kernel_resources(TOOLCHAIN, out, "matmul")
    assert 0 < resources["vgprs"] <= 32 and resources["sgprs"] > 0
    assert resources["agprs"] == 0  # no matrix instructions, no accumulators
    assert resources["lds_bytes"] == 0 and resources["scratch_bytes"] == 0
    assert resources["vgpr_spills"] == resources["sgpr_spills"] == 0
    assert resources["wavefront_size"] == 64
    assert resources["max_threads_per_block"] == 1024  # no __launch_bounds__
    assert occupancy(resources, arch) == 8 == llvm_occupancy(tmp_path, SEED, arch, defines)
    assert sorted(path.name for path in out.parent.iterdir()) == [out.name, f"naive-{arch}.hip"]


def test_each_arch_gets_its_own_code_and_is_disassembled_as_itself(tmp_path: Path) -> None:
    defines: dict[str, str | int] = {"DTYPE": "float", "ACC": "float"}
    gfx90a, gfx942 = (build(tmp_path, SEED, arch, defines) for arch in ARCHS)
    assert gfx90a.read_bytes() != gfx942.read_bytes()
    listing = disassemble(TOOLCHAIN, gfx942, "gfx942")
    assert "<matmul>:" in listing and "s_endpgm" in listing
    assert listing != disassemble(TOOLCHAIN, gfx90a, "gfx90a")
    with pytest.raises(UserError, match="holds code for gfx942, not gfx90a"):
        disassemble(TOOLCHAIN, gfx942, "gfx90a")


def test_a_define_decides_the_element_type(tmp_path: Path) -> None:
    """fp16 loads differ from fp32 ones: the -D macros reach the compiler."""
    listings = [disassemble(TOOLCHAIN, build(tmp_path, SEED, "gfx90a", defines,
                                             name=str(defines["DTYPE"])), "gfx90a")
                for defines in DTYPES]
    assert "global_load_ushort" not in listings[0]
    assert "global_load_ushort" in listings[1]


# ------------------------------------------------------------------ matrix cores


@pytest.mark.parametrize(("kernel", "arch", "mnemonic"), [
    ("mfma_f16", "gfx90a", "v_mfma_f32_32x32x8f16"),
    ("mfma_f16", "gfx942", "v_mfma_f32_32x32x8_f16"),  # renamed in gfx940's ISA
    ("mfma_f32", "gfx90a", "v_mfma_f32_32x32x2f32"),
    ("mfma_f32", "gfx942", "v_mfma_f32_32x32x2_f32"),
    ("smfmac_f16", "gfx942", "v_smfmac_f32_32x32x16_f16"),
])
def test_matrix_kernels_use_the_matrix_cores_and_accumulate_in_agprs(
        tmp_path: Path, kernel: str, arch: str, mnemonic: str) -> None:
    out = build(tmp_path, (FIXTURES / f"{kernel}.hip").read_text(), arch, name=kernel)
    assert matrix_instructions(disassemble(TOOLCHAIN, out, arch)) == [mnemonic]
    resources = kernel_resources(TOOLCHAIN, out, kernel)
    assert resources["agprs"] >= 16  # the 32x32 fp32 tile: 16 values per lane
    assert resources["vgprs"] >= resources["agprs"]  # the unified file counts both
    assert resources["max_threads_per_block"] == 64  # its __launch_bounds__


def test_matrix_instructions_reads_mnemonics_only() -> None:
    listing = """\
0000000000001900 <v_mfma_in_a_name>:
\tv_mfma_f32_32x32x8f16 a[0:15], v[2:3], v[4:5], a[0:15]     // 000000001900: D3CC8000
\tv_mfma_f32_32x32x8f16 a[0:15], v[6:7], v[8:9], a[0:15]     // 000000001908: D3CC8000
\tv_smfmac_f32_16x16x32_f16 v[0:3], v[4:5], v[6:9], v10      // 000000001910: D3E20000
\ts_branch 3 <v_mfma_in_a_name+0x20>                          // 000000001918: BF820003
\tv_accvgpr_read_b32 v0, a0                                   // 00000000191C: D3D84000
"""
    assert matrix_instructions(listing) == ["v_mfma_f32_32x32x8f16",
                                            "v_smfmac_f32_16x16x32_f16"]
    assert matrix_instructions("\tv_fma_f32 v0, v1, v2, v3\n") == []


# ------------------------------------------------------------------ resources, occupancy


@pytest.mark.parametrize(("floats", "expected_occupancy"), [(4096, 4), (8192, 2), (16384, 1)])
def test_a_shared_array_shows_in_lds_bytes_and_limits_occupancy(
        tmp_path: Path, floats: int, expected_occupancy: int) -> None:
    defines: dict[str, str | int] = {"LDS_FLOATS": floats}
    resources = kernel_resources(TOOLCHAIN, build(tmp_path, LDS_SOURCE, "gfx90a", defines),
                                 "staged")
    assert resources["lds_bytes"] == 4 * floats
    assert resources["max_threads_per_block"] == 256
    assert occupancy(resources, "gfx90a") == expected_occupancy
    assert llvm_occupancy(tmp_path, LDS_SOURCE, "gfx90a", defines) == expected_occupancy


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("accumulators", [60, 96, 200])
def test_occupancy_from_registers_agrees_with_llvm(tmp_path: Path, arch: str,
                                                   accumulators: int) -> None:
    defines: dict[str, str | int] = {"NACC": accumulators}
    resources = kernel_resources(TOOLCHAIN, build(tmp_path, WIDE_SOURCE, arch, defines),
                                 "wide")
    assert resources["vgprs"] > 60
    assert occupancy(resources, arch) == llvm_occupancy(tmp_path, WIDE_SOURCE, arch, defines)


def test_a_dynamically_indexed_local_array_goes_to_scratch(tmp_path: Path) -> None:
    resources = kernel_resources(TOOLCHAIN, build(tmp_path, SPILL_SOURCE, "gfx90a"), "lookup")
    assert resources["scratch_bytes"] >= 4096  # 1024 floats per lane
    assert occupancy(resources, "gfx90a") == 8  # scratch does not limit it


def test_occupancy_formula_at_the_edges() -> None:
    base = {"vgprs": 8, "agprs": 0, "sgprs": 16, "vgpr_spills": 0, "sgpr_spills": 0,
            "lds_bytes": 0, "scratch_bytes": 0, "wavefront_size": 64,
            "max_threads_per_block": 256}
    for vgprs, waves in [(1, 8), (64, 8), (65, 7), (128, 4), (129, 3), (256, 2), (512, 1)]:
        assert occupancy({**base, "vgprs": vgprs}, "gfx942") == waves, vgprs
    for sgprs, waves in [(80, 8), (100, 8), (101, 7), (102, 7)]:
        assert occupancy({**base, "sgprs": sgprs}, "gfx90a") == waves, sgprs
    # LDS granted in 512-byte blocks: 16 KiB + 4 bytes takes 16.5 KiB, three groups fit
    assert occupancy({**base, "lds_bytes": 16384 + 4}, "gfx90a") == 3
    # one-wave workgroups: 32 of them per CU fit the wave slots; LDS of 4 KiB allows 16
    assert occupancy({**base, "lds_bytes": 4096}, "gfx90a", threads_per_block=64) == 4
    with pytest.raises(UserError, match="not gfx1100"):
        occupancy(base, "gfx1100")


def test_a_missing_kernel_names_the_kernels_found(tmp_path: Path) -> None:
    out = build(tmp_path, SEED, "gfx90a", {"DTYPE": "float", "ACC": "float"})
    with pytest.raises(CompileError, match=r"no kernel 'gemm' .*kernels found: matmul"):
        kernel_resources(TOOLCHAIN, out, "gemm")


# ------------------------------------------------------------------ failures


def test_a_syntax_error_is_a_compile_error_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as caught:
        build(tmp_path, SYNTAX_ERROR_SOURCE, "gfx942", name="broken")
    assert "line 4" in str(caught.value) and "expected ';'" in str(caught.value)
    assert "broken-gfx942.hip:4:" in caught.value.detail  # the log, with the command
    assert "--offload-arch=gfx942" in caught.value.detail
    assert not (tmp_path / "build" / "broken-gfx942.co").exists()


@pytest.mark.parametrize("time_limit_s", [0.01, 1.0])
def test_a_build_past_its_budget_stops_and_leaves_nothing_running(
        tmp_path: Path, time_limit_s: float) -> None:
    name = f"budget-{uuid.uuid4().hex}"
    started = time.perf_counter()
    with pytest.raises(BuildOverBudget):
        build(tmp_path, (FIXTURES / "slow.hip").read_text(), "gfx90a", name=name,
              time_limit_s=time_limit_s)
    assert time.perf_counter() - started < time_limit_s + 3.0  # not the 7 s it needs
    assert running(name) == []  # the driver, cc1 and lld: the whole group was killed
    # neither a partial code object nor clang's temporary object stays behind
    assert sorted(path.name for path in (tmp_path / "build").iterdir()) == [
        f"{name}-gfx90a.hip"]


def test_a_compiler_killed_from_outside_is_the_machines_fault(tmp_path: Path) -> None:
    """The out-of-memory killer ending cc1 says nothing about the kernel: an
    EnvironmentFault, never a compile error that would be cached."""
    name = f"killed-{uuid.uuid4().hex}"
    caught: list[BaseException] = []

    def compile_slow() -> None:
        try:
            build(tmp_path, (FIXTURES / "slow.hip").read_text(), "gfx90a", name=name)
        except BaseException as exc:
            caught.append(exc)

    worker = threading.Thread(target=compile_slow)
    worker.start()
    deadline = time.monotonic() + 20.0
    while not (cc1 := running(f"[-]cc1 .*{name}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cc1, "cc1 never started"
    os.kill(int(cc1[0].split()[0]), signal.SIGKILL)
    worker.join(60.0)
    assert len(caught) == 1 and isinstance(caught[0], EnvironmentFault), caught
    assert caught[0].kind == COMPILER_KILLED


def test_no_clang_names_the_packages_to_install(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    old_clang = tmp_path / "bin" / "clang++"
    old_clang.parent.mkdir()
    old_clang.write_text("#!/bin/sh\necho 'Debian clang version 14.0.6'\n")
    old_clang.chmod(old_clang.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(old_clang.parent))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    with pytest.raises(BackendUnavailable) as caught:
        find_toolchain.__wrapped__()  # not the cached answer
    message = str(caught.value)
    assert "apt-get install clang-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs" in message
    assert "clang version 14.0.6" in message  # why the clang found was not taken
    assert "\n" not in message


def test_an_arch_the_compiler_cannot_target_is_unavailable_not_a_compile_error() -> None:
    older = dataclasses.replace(TOOLCHAIN, processors=frozenset({"gfx90a"}))
    with pytest.raises(BackendUnavailable, match="cannot target gfx942"):
        device_library_folder(older, "gfx942")
    with pytest.raises(UserError, match="not an AMD GPU target"):
        device_library_folder(TOOLCHAIN, "sm_90")


# ------------------------------------------------------------------ device libraries


def test_the_isa_version_rule_matches_every_installed_file() -> None:
    files = sorted(TOOLCHAIN.device_libs.glob("oclc_isa_version_*.bc"))
    assert len(files) > 10
    for path in files:
        arch = "gfx" + path.stem.removeprefix("oclc_isa_version_")
        assert isa_constant(path) == isa_version_number(arch), path.name
    assert isa_version_number("gfx942") == 9402
    assert isa_version_number("gfx90a:xnack-") == 9010


def test_gfx942s_library_folder_is_made_once_then_reused(fresh_cache: Path) -> None:
    if (TOOLCHAIN.device_libs / "oclc_isa_version_942.bc").exists():
        pytest.skip("the installed device libraries have gfx942's file")
    assert device_library_folder(TOOLCHAIN, "gfx90a") == TOOLCHAIN.device_libs
    folder = device_library_folder(TOOLCHAIN, "gfx942")
    assert folder.is_relative_to(fresh_cache / "peak-tune")
    made = folder / "oclc_isa_version_942.bc"
    assert isa_constant(made) == 9402
    installed = {path.name for path in TOOLCHAIN.device_libs.glob("*.bc")}
    assert {path.name for path in folder.iterdir()} == installed | {made.name}
    assert (folder / "ockl.bc").resolve() == (TOOLCHAIN.device_libs / "ockl.bc").resolve()
    first = made.stat()
    assert device_library_folder(TOOLCHAIN, "gfx942") == folder
    again = made.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]  # no leftovers


def test_processes_making_the_folder_at_once_all_compile(tmp_path: Path,
                                                         fresh_cache: Path) -> None:
    if (TOOLCHAIN.device_libs / "oclc_isa_version_942.bc").exists():
        pytest.skip("the installed device libraries have gfx942's file")
    script = ("import sys; from pathlib import Path; "
              "from peak_tune.backends._hip_amd import compile_code_object; "
              "compile_code_object(Path(sys.argv[1]).read_text(), 'gfx942', "
              "{'DTYPE': 'float', 'ACC': 'float'}, Path(sys.argv[2]), 0)")
    seed = ROOT / "seeds" / "matmul" / "naive.hip"
    processes = [subprocess.Popen([sys.executable, "-c", script, str(seed),
                                   str(tmp_path / f"naive-{n}.co")],
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT)
                 for n in range(3)]
    errors = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], errors
    for n in range(3):
        assert kernel_resources(TOOLCHAIN, tmp_path / f"naive-{n}.co", "matmul")["vgprs"] > 0
    made = list((fresh_cache / "peak-tune" / "hip-device-libs").iterdir())
    assert [path.name for path in made] == [device_library_folder(TOOLCHAIN, "gfx942").name]


def isa_constant(path: Path) -> int:
    """The __oclc_ISA_version a device library file defines."""
    text = subprocess.run([str(TOOLCHAIN.llvm_dis), str(path), "-o", "-"],
                          capture_output=True, text=True, check=True).stdout
    found = re.search(r"@__oclc_ISA_version = .*constant i32 (\d+)", text)
    assert found, text
    return int(found.group(1))
