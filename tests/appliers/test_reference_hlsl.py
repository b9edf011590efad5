"""The reference applier on the HLSL matmul shader: every step edits the shader the way
its text says (groupshared tiles, thread tiles, vector views, register staging), the
steps compose in any legal order, and every variant compiles to valid SPIR-V with each
HLSL compiler here and gives C = A x B on the Vulkan device (lavapipe in CI)."""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.appliers.reference.hlsl_matmul import HLSL_STEPS
from peak_tune.backends._hlsl_compile import (
    COMPILERS,
    HlslCompiler,
    compile_spirv,
    find_compiler,
    find_optimizer,
    needs_slang,
)
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.hlsl import HlslBackend
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext, ProblemSize
from peak_tune.errors import ApplyError, BackendUnavailable, InvalidPoint, WrongResult
from peak_tune.expr import evaluate_bool
from tests.backends.test_hlsl_toolchain import COMPILERS_HERE, _no_vulkan

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "seeds" / "matmul" / "naive.hlsl").read_text()
LAUNCH = {"grid_x": "ceil_div(N, group_x)", "grid_y": "ceil_div(M, group_y)"}
# small tiles: lavapipe runs a group's threads one after another
PARAMS = {"BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 8, "TRD_Y_DIM": 4, "TRD_X_DIM": 4,
          "OFFSET_AMOUNT": 1, "THREAD_CHUNK": 2, "SWIZZLE_GROUP": 2, "WARP_X_DIM": 2}
SIZE = ProblemSize.of({"M": 64, "N": 72, "K": 80})
CHECKS = (ProblemSize.of({"M": 13, "N": 11, "K": 17}),)
CONFIG = EvalConfig(timeout_s=60.0, warmup=1, repeats=2, max_timing_s=5.0)
needs_compiler = pytest.mark.skipif(not COMPILERS_HERE, reason="no HLSL compiler on PATH")
needs_vulkan = pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")
# the steps every Vulkan device has (cooperative-matrix needs a device that offers them)
COOPMAT_STEPS = ("cooperative-matrix", "direct-store", "workgroup-matrix")
SIMT_STEPS = tuple(t for t in HLSL_STEPS if t not in COOPMAT_STEPS)
COOPMAT_SEQUENCES = (
    ["refactor", "tb-tiling", "cooperative-matrix"],
    ["refactor", "tb-tiling", "register-staging", "double-buffer", "cooperative-matrix",
     "block-swizzle"],
    ["refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
     "cooperative-matrix"],
)
COOPMAT_PARAMS = {"BLOCK_M": 64, "BLOCK_N": 128, "TILE_K_SIZE": 32, "WAVES_M": 2,
                  "WAVES_N": 2, "SWIZZLE_GROUP": 4}
# lavapipe, with the matrices emulated: 2 subgroups, 1 x 2 tiles of 16 x 16 each
COOPMAT_SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 16, "WAVES_M": 2,
                 "WAVES_N": 1, "SWIZZLE_GROUP": 2}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.with_user_folders()


@pytest.fixture(scope="module")
def lavapipe(catalog: Catalog) -> DeviceProfile:
    return catalog.device("lavapipe")


def seed() -> KernelContext:
    return KernelContext(kernel="matmul", backend="hlsl", source=SEED, entry="main",
                         launch=dict(LAUNCH))


def applied(catalog: Catalog, device: DeviceProfile, sequence: list[str]) -> KernelContext:
    context, applier = seed(), ReferenceApplier()
    for tid in sequence:
        context = applier.apply(context, catalog.transformation(tid), device)
    return context


def with_requirements(catalog: Catalog, tid: str) -> list[str]:
    """The shortest sequence that ends in `tid`: what it requires, in order, then it."""
    done: list[str] = []

    def visit(step: str) -> None:
        for needed in catalog.transformation(step).requires:
            visit(needed)
        if step not in done:
            done.append(step)

    visit(tid)
    return done


def random_orders(catalog: Catalog, count: int, seed_: int = 7) -> Iterator[list[str]]:
    """Legal sequences of all the HLSL steps, in random orders (a step once all it
    requires is in, none after one it conflicts with, warp-tiling after thread-tiling)."""
    rng = random.Random(seed_)
    steps: dict[str, Transformation] = {t: catalog.transformation(t) for t in SIMT_STEPS}
    for _ in range(count):
        order: list[str] = []
        while len(order) < len(steps):
            ready = [t for t, s in steps.items() if t not in order
                     and all(r in order for r in s.requires)
                     and (t != "warp-tiling" or "thread-tiling" in order)]  # its rule
            order.append(rng.choice(ready))
        yield order


def slang_or_skip() -> HlslCompiler:
    """Slang's compiler, or the test skipped with the reason it is missing."""
    try:
        return find_compiler("slang")
    except BackendUnavailable as exc:
        pytest.skip(f"no slang to build the cooperative-matrix variants with: {exc}")


def params_of(context: KernelContext) -> dict[str, int]:
    names = {p.name for p in context.params}
    return {k: v for k, v in PARAMS.items() if k in names}


def test_the_catalog_offers_hlsl_the_simt_steps_and_no_vendor_ones(catalog):
    offered = {t.id for t in catalog.transformations_for("matmul", "hlsl")}
    assert offered == set(HLSL_STEPS)
    assert not offered & {"tensor-core", "wgmma", "pipelining", "ldmatrix", "mfma", "tma"}


def test_each_step_changes_the_shader_as_its_text_says(catalog, lavapipe):
    tiled = applied(catalog, lavapipe, ["refactor", "tb-tiling"])
    assert "groupshared DTYPE pt_smem[PT_SMEM_ELEMS];" in tiled.source
    assert tiled.source.count("GroupMemoryBarrierWithGroupSync();") == 2
    assert "[numthreads(PT_THREADS_X, PT_THREADS_Y, 1)]" in tiled.source
    assert dict(tiled.launch) == {"grid_x": "ceil_div(N, BLOCK_N)",
                                  "grid_y": "ceil_div(M, BLOCK_M)"}
    threads = applied(catalog, lavapipe, ["refactor", "tb-tiling", "thread-tiling"])
    assert "#define PT_TRD_Y TRD_Y_DIM" in threads.source
    assert any("<= 1024" in c for c in threads.constraints)  # lavapipe's group limit
    waves = applied(catalog, lavapipe, ["refactor", "tb-tiling", "thread-tiling",
                                        "warp-tiling"])
    assert "const int wave = tid / PT_WAVE_SIZE, lane = tid % PT_WAVE_SIZE;" in waves.source
    assert "WARP_X_DIM <= 8" in waves.constraints  # lavapipe's subgroups are 8 lanes
    vector = applied(catalog, lavapipe, ["refactor", "tb-tiling", "vector-loads"])
    assert "[[vk::binding(0)]] StructuredBuffer<PT_DTYPE4> A4;" in vector.source
    assert "const bool vec = K % PT_VEC == 0 && N % PT_VEC == 0;" in vector.source
    staged = applied(catalog, lavapipe, ["refactor", "tb-tiling", "register-staging",
                                         "double-buffer"])
    assert "DTYPE ra[PT_A_REGS], rb[PT_B_REGS];" in staged.source
    assert "#define PT_STAGES 2" in staged.source
    for context in (tiled, threads, waves, vector, staged):
        assert "#pragma" not in context.source and "__" not in context.source  # no CUDA


def test_different_orders_give_different_states_but_one_shader_per_plan(catalog, lavapipe):
    one = applied(catalog, lavapipe, ["refactor", "tb-tiling", "offset", "transpose"])
    other = applied(catalog, lavapipe, ["refactor", "tb-tiling", "transpose", "offset"])
    assert one.source == other.source  # the same plan, whichever order reached it
    assert one.applied != other.applied
    assert one.source != applied(catalog, lavapipe, ["refactor", "tb-tiling", "offset"]).source


def test_illegal_steps_and_foreign_shaders_are_refused(catalog, lavapipe):
    applier = ReferenceApplier()
    with pytest.raises(InvalidPoint, match="requires refactor"):
        applier.apply(seed(), catalog.transformation("tb-tiling"), lavapipe)
    refactored = applied(catalog, lavapipe, ["refactor"])
    with pytest.raises(InvalidPoint, match="applied twice"):
        applier.apply(refactored, catalog.transformation("refactor"), lavapipe)
    edited = dataclasses.replace(seed(), source=SEED.replace("B[k * sizes.N + col]",
                                                             "B[k * sizes.N + row]"))
    with pytest.raises(ApplyError, match="accumulates something other"):
        applier.apply(edited, catalog.transformation("refactor"), lavapipe)
    changed = dataclasses.replace(refactored, source=refactored.source + "// edited\n")
    with pytest.raises(ApplyError, match="changed after the reference applier"):
        applier.apply(changed, catalog.transformation("tb-tiling"), lavapipe)


@needs_compiler
@pytest.mark.hlsl
@pytest.mark.parametrize("compiler", COMPILERS)
def test_every_variant_compiles_to_valid_spirv(catalog, lavapipe, compiler, tmp_path):
    """Every step with what it requires, and the whole catalog in random orders, in fp32
    and fp16, through each compiler that is installed (DXC, glslang, Slang; spirv-val
    checks each module)."""
    try:
        chosen = find_compiler(compiler)
    except BackendUnavailable as exc:
        pytest.skip(f"no {compiler} to build the variants with: {exc}")
    sequences = [with_requirements(catalog, t) for t in SIMT_STEPS]
    sequences += list(random_orders(catalog, 4))
    for index, sequence in enumerate(sequences):
        context = applied(catalog, lavapipe, sequence)
        for dtype, element in (("float32", "float"), ("float16", "half")):
            defines = {"DTYPE": element, "ACC": "float", "PT_WAVE_SIZE": lavapipe.wave_size,
                       **params_of(context)}
            _, found = compile_spirv(chosen, context.source, defines,
                                     tmp_path / f"{index}-{dtype}.spv",
                                     sixteen_bit=dtype == "float16")
            threads = (PARAMS["BLOCK_M"] * PARAMS["BLOCK_N"]
                       // (16 if "thread-tiling" in sequence else 1))
            assert found.threads == threads, sequence
            assert (found.shared_bytes > 0) == ("tb-tiling" in sequence), sequence


@needs_compiler
@needs_vulkan
@pytest.mark.hlsl
@pytest.mark.parametrize("spirv_opt", ["off", "on"])
def test_every_step_and_random_orders_validate_on_the_vulkan_device(catalog, lavapipe,
                                                                    spirv_opt, tmp_path):
    """As the compiler wrote them, and through spirv-opt's passes (unrolled, in SSA)."""
    if spirv_opt == "on" and find_optimizer() is None:
        pytest.skip("no spirv-opt here")
    sequences = [with_requirements(catalog, t) for t in SIMT_STEPS]
    sequences += list(random_orders(catalog, 2, seed_=11))
    spec = catalog.spec("matmul")
    speeds = {}
    device = dataclasses.replace(lavapipe, facts={**lavapipe.facts, "spirv_opt": spirv_opt})
    with HlslBackend(device) as backend:
        backend.probe()
        assert backend.fingerprint()["optimizer"].startswith(
            "spirv-opt" if spirv_opt == "on" else "none")
        for sequence in sequences:
            context = applied(catalog, lavapipe, sequence)
            params = params_of(context)
            artifact = backend.compile(context, params, "float32", str(tmp_path))
            request = EvalRequest(spec=spec, context=context, params=params,
                                  dtype="float32", size=SIZE, check_sizes=CHECKS,
                                  config=CONFIG)
            speeds[" > ".join(sequence)] = backend.evaluate(artifact, request).gflops
    assert all(g > 0 for g in speeds.values()), speeds
    assert len(set(speeds.values())) > 1  # different code, different speed


@needs_compiler
@needs_vulkan
@pytest.mark.hlsl
def test_the_papers_sequence_validates_in_fp16(catalog, lavapipe, tmp_path):
    sequence = ["refactor", "tb-tiling", "thread-tiling", "vector-loads", "register-staging"]
    context = applied(catalog, lavapipe, sequence)
    params = params_of(context)
    with HlslBackend(lavapipe) as backend:
        backend.probe()
        artifact = backend.compile(context, params, "float16", str(tmp_path))
        request = EvalRequest(spec=catalog.spec("matmul"), context=context, params=params,
                              dtype="float16", size=SIZE, check_sizes=CHECKS, config=CONFIG)
        assert backend.evaluate(artifact, request).gflops > 0


# ---------------------------------------------------------------- cooperative matrices


def test_cooperative_matrix_replaces_the_simt_tiles_where_the_device_has_them(catalog):
    h200 = catalog.device("h200")
    shaders = [applied(catalog, h200, sequence) for sequence in COOPMAT_SEQUENCES]
    first = shaders[0]
    assert "using namespace linalg;" in first.source
    assert "acc[i][j] = coopMatMulAdd<float, false>(a[i], b[j], acc[i][j]);" in first.source
    # tiles in groupshared uint4 (8 halves each), copied 16 bytes at a time
    assert "TileA.Load<CoopMatMatrixLayout::RowMajor>(pt_smem4, (as + (wr + 16 * i) * PT_LDA" \
        " + kk) / 8, PT_LDA / 8);" in first.source
    assert "if (full) return A8[off / 8];" in first.source
    assert "#define PT_PAD 8" in first.source  # rows off each other's banks
    assert "if (r < M && c < N) C[r * N + c] = pt_out[slot + e];" in first.source
    assert {"WAVES_M", "WAVES_N"} <= {p.name for p in first.params}
    assert "BLOCK_M % (16 * WAVES_M) == 0" in first.constraints
    assert "32 * WAVES_M * WAVES_N <= 1024" in first.constraints  # the H200's subgroups
    assert len({s.source for s in shaders}) == len(shaders)  # the steps around it show
    offered = {t.id for t in catalog.transformations_for("matmul", "hlsl", "float32")}
    assert "cooperative-matrix" not in offered  # fp16 only
    step = catalog.transformation("cooperative-matrix")
    applier = ReferenceApplier()
    with pytest.raises(InvalidPoint, match="names none"):
        applied(catalog, catalog.device("lavapipe"), COOPMAT_SEQUENCES[0])
    threads = applied(catalog, h200, ["refactor", "tb-tiling", "thread-tiling"])
    with pytest.raises(InvalidPoint, match="cooperative-matrix conflicts with thread-tiling"):
        applier.apply(threads, step, h200)
    with pytest.raises(InvalidPoint, match="coopmat and transpose_a exclude each other"):
        applier.apply(first, catalog.transformation("transpose"), h200)


# the cooperative-matrix calls and what the emulation puts in their place
_EMULATED = ((r"TileA\.Load<CoopMatMatrixLayout::RowMajor>\(pt_smem4, ", "emu_load("),
             (r"TileB\.Load<CoopMatMatrixLayout::RowMajor>\(pt_smem4, ", "emu_load("),
             (r"coopMatMulAdd<float, false>\(", "emu_mma("),
             (r"acc\[i\]\[j\] = Sum\(0\.0\);", "acc[i][j] = emu_zero(wave, i, j);"),
             (r"Out\((.+?)\)\.Store<CoopMatMatrixLayout::RowMajor>\((pt_out|C), ",
              r"emu_store_\2(\1, "),
             (r"using namespace linalg;\n(typealias \w+ = CoopMat<.*>;\n)+", ""))
EMULATION = (ROOT / "tests" / "fixtures" / "hlsl" / "coopmat_emulation.slang").read_text()


def emulated(source: str) -> str:
    """`source` with its cooperative matrices emulated lane by lane (the fixture)."""
    for pattern, replacement in _EMULATED:
        source, count = re.subn(pattern, replacement, source)
        assert count, f"the shader has no {pattern}: the emulation is out of date"
    assert not needs_slang(source.replace("linalg", "")), "a cooperative-matrix call is left"
    emulation = EMULATION
    if "pt_out" not in source:  # direct-store: no slot, and no store into one
        emulation = re.sub(r"\nvoid emu_store_pt_out\(.*?\n}\n", "\n", emulation, flags=re.S)
    return source.replace("[numthreads(", emulation + "\n[numthreads(", 1)


@needs_vulkan
@pytest.mark.hlsl
@pytest.mark.parametrize("sequence", COOPMAT_SEQUENCES, ids=lambda s: " > ".join(s[2:]))
def test_cooperative_matrix_variants_give_c_with_the_matrices_emulated(catalog, lavapipe,
                                                                       sequence, tmp_path):
    """The copies into the groupshared uint4 tiles (16-byte loads inside the matrix,
    gathered and packed pieces at its edges and for rows of odd length), the tiles'
    offsets and strides in uint4, register staging, and the epilogue give C = A x B:
    on lavapipe, with each cooperative-matrix call done by every lane in full."""
    slang_or_skip()
    context = applied(catalog, catalog.device("h200"), sequence)
    device = dataclasses.replace(lavapipe, facts={**lavapipe.facts, "hlsl_compiler": "slang"})
    params = {k: v for k, v in COOPMAT_SMALL.items() if k in {p.name for p in context.params}}
    # 64 x 72 x 80: rows of whole pieces; 13 x 11 x 17: every piece gathered
    checks = (*CHECKS, ProblemSize.of({"M": 40, "N": 24, "K": 48}))
    with HlslBackend(device) as backend:
        backend.probe()

        def run(source: str) -> float:
            shader = dataclasses.replace(context, source=source)
            artifact = backend.compile(shader, params, "float16", str(tmp_path))
            return backend.evaluate(artifact, EvalRequest(
                spec=catalog.spec("matmul"), context=shader, params=params, dtype="float16",
                size=SIZE, check_sizes=checks, config=CONFIG)).gflops

        assert run(emulated(context.source)) > 0
        # the check can fail: a 16-byte load one piece off is caught
        misread = emulated(context.source).replace("return A8[off / 8];",
                                                   "return A8[off / 8 + 1];")
        with pytest.raises(WrongResult):
            run(misread)


DIRECT = ["refactor", "block-swizzle", "tb-tiling", "vector-loads", "interior-tiles",
          "cooperative-matrix", "direct-store"]


@needs_vulkan
@pytest.mark.hlsl
def test_direct_store_gives_c_at_whole_tiles_and_refuses_other_sizes(catalog, lavapipe,
                                                                     tmp_path):
    """direct-store's tiles go straight to C: right at sizes of whole block tiles (the
    matrices emulated on lavapipe), a store one column off is caught, and a size that is
    not whole tiles is refused before anything runs (the variant's size constraints)."""
    slang_or_skip()
    context = applied(catalog, catalog.device("h200"), DIRECT)
    assert context.size_constraints == ("M % BLOCK_M == 0", "N % BLOCK_N == 0", "N % 8 == 0")
    assert "pt_out" not in context.source
    device = dataclasses.replace(lavapipe, facts={**lavapipe.facts, "hlsl_compiler": "slang"})
    params = {k: v for k, v in COOPMAT_SMALL.items() if k in {p.name for p in context.params}}
    whole = ProblemSize.of({"M": 64, "N": 64, "K": 80})
    # 13 x 11 x 17 is not whole tiles: left out of the checks; 32 x 96 x 48 is checked
    checks = (*CHECKS, ProblemSize.of({"M": 32, "N": 96, "K": 48}))
    with HlslBackend(device) as backend:
        backend.probe()

        def run(source: str, size: ProblemSize) -> float:
            shader = dataclasses.replace(context, source=source)
            artifact = backend.compile(shader, params, "float16", str(tmp_path))
            return backend.evaluate(artifact, EvalRequest(
                spec=catalog.spec("matmul"), context=shader, params=params, dtype="float16",
                size=size, check_sizes=checks, config=CONFIG)).gflops

        assert run(emulated(context.source), whole) > 0
        shifted = emulated(context.source).replace("bn + wc + 16 * j, N);",
                                                   "bn + wc + 16 * j + 1, N);")
        assert shifted != emulated(context.source)
        with pytest.raises(WrongResult):
            run(shifted, whole)
        with pytest.raises(InvalidPoint, match="N % BLOCK_N == 0"):
            run(emulated(context.source), SIZE)


def test_direct_store_needs_cooperative_matrices(catalog):
    with pytest.raises(InvalidPoint, match="requires cooperative-matrix"):
        applied(catalog, catalog.device("h200"), ["refactor", "tb-tiling", "direct-store"])


@pytest.mark.hlsl
def test_cooperative_matrix_variants_build_with_slang(catalog, tmp_path):
    """Slang compiles them to SPIR-V that spirv-val accepts, with the cooperative-matrix
    capability and one subgroup of 32 lanes per 16 x 16 tile grid cell (WAVES_M x
    WAVES_N); lavapipe cannot run them, the H200 does (benchmarks/hlsl_matmul.py)."""
    slang = slang_or_skip()
    h200 = catalog.device("h200")
    for index, sequence in enumerate(COOPMAT_SEQUENCES):
        context = applied(catalog, h200, sequence)
        names = {p.name for p in context.params}
        defines = {"DTYPE": "half", "ACC": "float", "PT_WAVE_SIZE": 32,
                   **{k: v for k, v in COOPMAT_PARAMS.items() if k in names}}
        _, found = compile_spirv(slang, context.source, defines, tmp_path / f"{index}.spv",
                                 sixteen_bit=True)
        assert found.threads == 32 * 2 * 2, sequence
        assert "CooperativeMatrixKHR" in found.capabilities, sequence


def test_the_ci_compiler_check_lists_a_build_for_every_step():
    """.ci/compiler_check.py gates each HLSL compiler in CI: a step it cannot derive
    would unset the compiler and skip every test that uses it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("compiler_check",
                                                  ROOT / ".ci" / "compiler_check.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    for compiler in ("dxc", "slang"):
        names = [case[0] for case in check.cases(compiler)]
        expected = set(SIMT_STEPS) | (set(COOPMAT_STEPS) if compiler == "slang" else set())
        assert expected <= set(names), compiler
    coopmat = next(case for case in check.cases("slang") if case[0] == "cooperative-matrix")
    assert coopmat[2]["DTYPE"] == "half" and coopmat[3]  # fp16 with 16-bit types


WORKGROUP = [*DIRECT[:3], "cooperative-matrix", "workgroup-matrix"]


@pytest.fixture
def coopmat2(catalog: Catalog) -> DeviceProfile:
    """The H200's profile with workgroup-scope matrices offered (its own does not: they
    ran slower than the subgroup tiles there)."""
    h200 = catalog.device("h200")
    return dataclasses.replace(h200, facts={**h200.facts,
                                            "workgroup_matrix": "VK_NV_cooperative_matrix2"})


def test_workgroup_matrix_gives_the_group_one_matrix_through_tensor_layouts(catalog,
                                                                           coopmat2):
    """One BLOCK_M x BLOCK_N accumulator of the thread group, its tiles loaded from A and
    B (no groupshared tiles left) and the result stored to C through slices of clamped
    tensor layouts, so the variant serves every size (no size constraints)."""
    context = applied(catalog, coopmat2, WORKGROUP)
    source = context.source
    for type_ in ("CoopMat<DTYPE, MemoryScope.Workgroup, BLOCK_M, PT_TK, "
                  "CoopMatMatrixUse::MatrixA>",
                  "CoopMat<float, MemoryScope.Workgroup, BLOCK_M, BLOCK_N, "
                  "CoopMatMatrixUse::MatrixAccumulator>"):
        assert type_ in source
    assert "MemoryScope.Subgroup" not in source and "groupshared" not in source
    assert "TensorLayout<2, CoopMatClampMode.Constant> a_layout, b_layout, c_layout;" in source
    assert "TileA.Load(A, 0, a_matrix.Slice(bm, BLOCK_M, k0, PT_TK));" in source
    assert "TileB.Load(B, 0, b_matrix.Slice(k0, PT_TK, bn, BLOCK_N));" in source
    assert "Out(acc).Store(C, 0, c_matrix.Slice(bm, BLOCK_M, bn, BLOCK_N));" in source
    assert ".ClampValue(0)" in source  # what a load reads past the edge adds nothing
    assert context.size_constraints == ()


@pytest.mark.parametrize(("waves", "block", "ok"), [
    ((2, 2), (128, 128), True),
    ((2, 4), (128, 256), True),  # 256 threads, the driver's most
    ((4, 4), (256, 256), False),  # 512 threads: no workgroup-scope shape has them
    ((1, 4), (48, 128), False),  # 128 threads want M in steps of 32
    ((1, 2), (48, 64), True),  # 64 threads take M in steps of 16
    ((2, 4), (64, 48), False),  # 256 threads want N in steps of 32 too
])
def test_workgroup_matrix_keeps_to_the_drivers_workgroup_shapes(catalog, coopmat2, waves,
                                                                block, ok):
    """The point's thread group and tile must be a workgroup-scope shape the driver lists
    (NVIDIA's flexible dimensions: 32-256 threads; M in steps of 32 from 128 threads, N
    too at 256): others are pruned before a build instead of failing on the device."""
    context = applied(catalog, coopmat2, WORKGROUP)
    point = {"WAVES_M": waves[0], "WAVES_N": waves[1], "BLOCK_M": block[0],
             "BLOCK_N": block[1], "TILE_K_SIZE": 32}
    ours = context.constraints[-3:]  # workgroup-matrix's own, after cooperative-matrix's
    assert all(evaluate_bool(c, point) for c in ours) == ok


def test_workgroup_matrix_needs_the_devices_workgroup_scope_and_no_groupshared_copies(
        catalog, coopmat2):
    with pytest.raises(InvalidPoint, match="facts.workgroup_matrix"):  # the H200's own
        applied(catalog, catalog.device("h200"), WORKGROUP)
    h200 = coopmat2
    with pytest.raises(InvalidPoint, match="vector-loads"):
        applied(catalog, h200, [*DIRECT[:-1], "workgroup-matrix"])
    with pytest.raises(InvalidPoint):  # and not after it either
        applied(catalog, h200, [*WORKGROUP, "vector-loads"])
    with pytest.raises(InvalidPoint, match="requires cooperative-matrix"):
        applied(catalog, h200, WORKGROUP[:3] + ["workgroup-matrix"])
    with pytest.raises(InvalidPoint, match="direct-store"):  # whole tiles: not wanted
        applied(catalog, h200, [*WORKGROUP[:4], "direct-store", "workgroup-matrix"])
    with pytest.raises(InvalidPoint, match="direct-store"):
        applied(catalog, h200, [*WORKGROUP, "direct-store"])


@pytest.mark.hlsl
def test_workgroup_matrix_builds_with_slang_into_workgroup_scope_matrices(
        catalog, lavapipe, coopmat2, tmp_path):
    """Slang compiles it to SPIR-V whose matrices have workgroup scope and are addressed
    through tensor layouts (spirv-val accepts them); lavapipe, which has no cooperative
    matrices, prunes it before it runs."""
    slang = slang_or_skip()
    context = applied(catalog, coopmat2, WORKGROUP)
    values = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "WAVES_M": 2, "WAVES_N": 2,
              "SWIZZLE_GROUP": 4}
    params = {k: v for k, v in values.items() if k in {p.name for p in context.params}}
    _, found = compile_spirv(slang, context.source,
                             {"DTYPE": "half", "ACC": "float", "PT_WAVE_SIZE": 32, **params},
                             tmp_path / "workgroup.spv", sixteen_bit=True)
    assert found.workgroup_matrices and found.threads == 128
    assert "TensorAddressingNV" in found.capabilities
    if _no_vulkan() is not None:
        return
    device = dataclasses.replace(lavapipe, facts={**lavapipe.facts, "hlsl_compiler": "slang"})
    with HlslBackend(device) as backend:
        backend.probe()
        artifact = backend.compile(context, params, "float16", str(tmp_path))
        with pytest.raises(InvalidPoint, match="cooperative matrices"):
            backend.evaluate(artifact, EvalRequest(
                spec=catalog.spec("matmul"), context=context, params=params,
                dtype="float16", size=ProblemSize.of({"M": 128, "N": 128, "K": 64}),
                check_sizes=(), config=CONFIG))
