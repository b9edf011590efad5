"""The wgmma transformation of the CUDA matmul reference: rule, geometry, NVRTC builds.

Builds run for sm_90a with NVRTC from the pip wheels (skipped without them); correctness
and speed on an H200: benchmarks/wgmma_check.py (results in benchmarks/results).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from peak_tune.appliers.reference.cuda_matmul import Plan, apply_transformation
from peak_tune.appliers.reference.cuda_matmul.plan import dump_plan, load_plan
from peak_tune.appliers.reference.cuda_matmul.rules import RULES
from peak_tune.backends._cuda_launch import evaluate_launch, tensor_map_boxes
from peak_tune.backends._nvrtc import compile_cubin, include_dir
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device
from peak_tune.errors import CompileError, InvalidPoint
from peak_tune.expr import evaluate_bool
from tests.appliers.conftest import build_cuda as build
from tests.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"
PREFIX = ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining")
WGMMA = (*PREFIX, "wgmma", "block-swizzle")
SPECIALISED = (*PREFIX, "wgmma", "warp-specialize", "block-swizzle")
KERNELS = {"wgmma": WGMMA, "warp-specialize": SPECIALISED,
           "wgmma hoisted": (*WGMMA, "address-hoisting"),
           "warp-specialize hoisted": (*SPECIALISED, "address-hoisting"),
           "wgmma tma": (*WGMMA, "tma"), "warp-specialize tma": (*SPECIALISED, "tma")}
POINT = {"BLOCK_M": 256, "BLOCK_N": 128, "TILE_K_SIZE": 64, "NUM_STAGES": 3, "WGMMA_N": 128,
         "SWIZZLE_GROUP": 8}


def test_wgmma_is_in_the_catalog_with_its_requirements(cuda_catalog):
    wgmma = cuda_catalog["wgmma"]
    assert set(wgmma.requires) == {"tensor-core", "vector-loads", "pipelining"}
    assert {"tensor-tiling", "ldmatrix", "transpose", "offset"} <= set(wgmma.conflicts)
    assert [p.name for p in wgmma.params] == ["WGMMA_N"]
    assert "wgmma.mma_async" in " ".join(p.text for p in wgmma.passes)


def test_hopper_profiles_build_for_sm_90a():
    for name in ("h100", "h200"):
        assert load_device(DEVICES / f"{name}.toml").facts["arch"] == "sm_90a"


def test_wgmma_prints_warpgroup_mmas_and_their_fences(cuda_catalog, cuda_seed, h200):
    source = build(cuda_seed, WGMMA, cuda_catalog, h200).source
    for shape in (64, 128, 256):
        assert f"wgmma.mma_async.sync.aligned.m64n{shape}k16.f32.f16.f16" in source
        assert f"wgmma.mma_async.sync.aligned.m64n{shape}k16.f32.bf16.bf16" in source
    for ptx in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                "wgmma.wait_group.sync.aligned", "fence.proxy.async.shared::cta",
                "__CUDA_ARCH_FEAT_SM90_ALL", "__launch_bounds__(PT_THREADS)"):
        assert ptx in source, ptx
    assert "pt_mma(" not in source.split('extern "C"')[1]  # no mma.sync in the kernel


def test_wgmma_geometry_and_constraints(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, WGMMA, cuda_catalog, h200)
    assert all(evaluate_bool(c, POINT) for c in context.constraints)
    shape = evaluate_launch(context.launch, {**POINT, "M": 4096, "N": 4096, "K": 4096})
    assert shape.block == (512, 1, 1) and shape.grid == (32, 16, 1)
    assert shape.shared_bytes == 3 * (256 * 64 + 64 * 128) * 2 + 1024
    for broken in ({"BLOCK_M": 32}, {"BLOCK_N": 64, "WGMMA_N": 128}, {"TILE_K_SIZE": 32},
                   {"BLOCK_M": 256, "BLOCK_N": 256, "WGMMA_N": 64},  # 2048 threads
                   {"BLOCK_M": 256, "BLOCK_N": 256, "WGMMA_N": 256}):  # registers
        assert not all(evaluate_bool(c, {**POINT, **broken}) for c in context.constraints), broken


def test_wgmma_is_refused_off_sm_90a_and_without_its_prefix(cuda_catalog, cuda_seed, h200):
    a100 = load_device(DEVICES / "a100.toml")
    with pytest.raises(InvalidPoint, match="needs an sm_90a target"):
        build(cuda_seed, WGMMA, cuda_catalog, a100)
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    no_stages = build(cuda_seed, ("refactor", "tb-tiling", "tensor-core", "vector-loads"), loose,
                      h200)
    with pytest.raises(InvalidPoint, match="cp.async stages of pipelining"):
        apply_transformation(no_stages, loose["wgmma"], h200)
    tiled = build(cuda_seed, (*PREFIX, "tensor-tiling"), loose, h200)
    with pytest.raises(InvalidPoint, match="instead of them"):
        apply_transformation(tiled, loose["wgmma"], h200)
    with pytest.raises(InvalidPoint, match="conflicts with offset"):
        build(cuda_seed, ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining",
                     "offset", "wgmma"), cuda_catalog, h200)


@pytest.mark.parametrize("later", ["tensor-tiling", "ldmatrix", "transpose", "offset"])
def test_steps_that_cannot_follow_wgmma_are_invalid(later, cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, WGMMA, cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="exclude each other"):
        apply_transformation(context, cuda_catalog[later], h200)


def test_earlier_plan_states_keep_their_form():
    """The flags added for wgmma and warp-specialize are stored only when set: older
    states still load."""
    assert '"wgmma"' not in dump_plan(Plan()) and '"producer"' not in dump_plan(Plan())
    assert load_plan(dump_plan(Plan())) == Plan()
    plan = Plan(shared=True, mma=True, vector_a=True, vector_b=True, stages=True, wgmma=True)
    assert load_plan(dump_plan(plan)) == plan
    assert '"producer"' not in dump_plan(plan)
    assert load_plan(dump_plan(plan.but(producer=True))) == plan.but(producer=True)


def _shape(point: dict[str, int]) -> str:
    return f"{point['BLOCK_M']}x{point['BLOCK_N']}n{point['WGMMA_N']}s{point['NUM_STAGES']}"


@needs_nvrtc
@pytest.mark.parametrize(("kernel", "point"), [
    ("wgmma", POINT),
    ("wgmma", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}),
    ("wgmma", {**POINT, "BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 2}),
    ("warp-specialize", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256,
                         "NUM_STAGES": 4}),
    ("warp-specialize", {**POINT, "NUM_STAGES": 3}),
    ("warp-specialize", {**POINT, "BLOCK_M": 128, "BLOCK_N": 128, "WGMMA_N": 128,
                         "NUM_STAGES": 6}),
    ("wgmma hoisted", POINT),
    ("wgmma hoisted", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256,
                       "NUM_STAGES": 4}),
    ("warp-specialize hoisted", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256,
                                 "NUM_STAGES": 4}),
    ("warp-specialize hoisted", {**POINT, "NUM_STAGES": 3}),
    ("wgmma tma", POINT),
    ("wgmma tma", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}),
    ("warp-specialize tma", {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256,
                             "NUM_STAGES": 4}),
    ("warp-specialize tma", {**POINT, "BLOCK_M": 128, "TILE_K_SIZE": 128}),
], ids=lambda p: p if isinstance(p, str) else _shape(p))
def test_warpgroup_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    context = build(cuda_seed, KERNELS[kernel], cuda_catalog, h200)
    artifact = CudaBackend(h200).compile(context, point, "float16", str(tmp_path))
    assert artifact.resources["registers"] > 0 and artifact.resources["stack_bytes"] == 0


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("extra", ["split-k", "launch-bounds"])
def test_warpgroup_kernels_build_with_split_k_and_launch_bounds(
    kernel, extra, cuda_catalog, cuda_seed, h200, tmp_path
):
    context = build(cuda_seed, (*KERNELS[kernel], extra), cuda_catalog, h200)
    point = {**POINT, "K_SPLITS": 4, "MIN_BLOCKS_PER_SM": 1}
    values = {p.name: point[p.name] for p in context.params}
    assert CudaBackend(h200).compile(context, values, "float16", str(tmp_path)).resources


@needs_nvrtc
def test_wgmma_builds_for_bf16_and_refuses_fp32_and_sm_90(cuda_catalog, cuda_seed, h200, tmp_path):
    context = build(cuda_seed, WGMMA, cuda_catalog, h200)
    flags = ["-std=c++17", f"-I{include_dir()}", *(f"-D{k}={v}" for k, v in POINT.items()),
             "-DACC=float"]
    compile_cubin(context.source, [*flags, "-arch=sm_90a", "-DDTYPE=__nv_bfloat16"])
    with pytest.raises(CompileError) as caught:
        compile_cubin(context.source, [*flags, "-arch=sm_90", "-DDTYPE=__half"])
    assert "wgmma needs the sm_90a target" in caught.value.detail
    with pytest.raises(CompileError) as caught:
        CudaBackend(h200).compile(context, POINT, "float32", str(tmp_path))
    assert "tensor-core needs DTYPE __half or __nv_bfloat16" in caught.value.detail


def test_warp_specialize_needs_wgmma(cuda_catalog, cuda_seed, h200):
    assert cuda_catalog["warp-specialize"].requires == ("wgmma",)
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    with pytest.raises(InvalidPoint, match="needs the warpgroup kernel of wgmma"):
        build(cuda_seed, (*PREFIX, "warp-specialize"), loose, h200)
    context = build(cuda_seed, SPECIALISED, cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="applied twice"):
        apply_transformation(context, loose["warp-specialize"], h200)


def test_warp_specialize_hands_tiles_over_with_mbarriers(cuda_catalog, cuda_seed, h200):
    source = build(cuda_seed, SPECIALISED, cuda_catalog, h200).source
    for ptx in ("mbarrier.init.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                "mbarrier.arrive.shared::cta.b64"):
        assert ptx in source, ptx
    kernel = source.split('extern "C"')[1]
    # one __syncthreads (after the barriers are initialised), none in the K loops
    assert kernel.count("__syncthreads()") == 1
    assert "pt_cp_wait<PT_STAGES - 2>" not in kernel
    producer, consumers = kernel.split("if (wg == PT_CONSUMERS)")[1].split("return;")
    assert "pt_wg_copy_a" in producer and "pt_wgmma" not in producer
    assert "pt_wgmma" in consumers and "pt_wg_copy_a" not in consumers


def test_warp_specialize_geometry_and_constraints(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, SPECIALISED, cuda_catalog, h200)
    point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}
    assert all(evaluate_bool(c, point) for c in context.constraints)
    shape = evaluate_launch(context.launch, {**point, "M": 4096, "N": 4096, "K": 4096})
    assert shape.block == (384, 1, 1)  # two MMA warpgroups and the producer
    assert shape.shared_bytes == 4 * (128 * 64 + 64 * 256) * 2 + 1024 + 16 * 4
    for broken in ({"NUM_STAGES": 2},
                   {"BLOCK_M": 256, "BLOCK_N": 256, "WGMMA_N": 64},  # 17 warpgroups
                   {"BLOCK_M": 256, "BLOCK_N": 256, "WGMMA_N": 256}):  # registers
        assert not all(evaluate_bool(c, {**point, **broken}) for c in context.constraints), \
            broken


HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __restrict__
struct uint4 { unsigned x, y, z, w; };
typedef uint16_t DTYPE;
#define PT_ZERO DTYPE(0)
#define PT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define PT_TK TILE_K_SIZE
#define PT_LOADERS 128
%(pieces)s
// Every copier thread copies the tiles at (bm, k0) of A and (k0, bn) of B both ways;
// the shared images must be equal, chunk for chunk.
int main() {
    const int M = 1024, N = 1024, K = 1024, bm = 256, bn = 512, k0 = 128;
    std::vector<DTYPE> A(M * K), B(K * N);
    for (int i = 0; i < M * K; ++i) A[i] = DTYPE(i * 7 + 1);
    for (int i = 0; i < K * N; ++i) B[i] = DTYPE(i * 13 + 3);
    std::vector<DTYPE> a1(BLOCK_M * PT_TK), a2(a1.size()), b1(PT_TK * BLOCK_N), b2(b1.size());
    for (int i = 0; i < PT_COPIERS; ++i) {
        pt_wg_copy_a(a1.data(), A.data(), K, bm, k0, M, K, i, true);
        pt_wg_copy_b(b1.data(), B.data(), N, k0, bn, K, N, i, true);
        const int a_ch = i %% (PT_TK / 8), a_r0 = i / (PT_TK / 8);
        const int b_ch = i %% (BLOCK_N / 8), b_r0 = i / (BLOCK_N / 8);
        pt_wg_copy_inside<BLOCK_M, PT_TK / 8>(a2.data(),
            A.data() + (size_t)(bm + a_r0) * K + k0 + a_ch * 8,
            (size_t)(PT_COPIERS / (PT_TK / 8)) * K, a_r0, a_ch);
        pt_wg_copy_inside<PT_TK, BLOCK_N / 8>(b2.data(),
            B.data() + (size_t)(k0 + b_r0) * N + bn + b_ch * 8,
            (size_t)(PT_COPIERS / (BLOCK_N / 8)) * N, b_r0, b_ch);
    }
    const bool same = a1 == a2 && b1 == b2;
    const bool filled = std::count(a1.begin(), a1.end(), DTYPE(0)) < 8;
    std::printf("%%s %%s\n", same ? "same" : "different", filled ? "filled" : "holes");
    return 0;
}
"""


def _between(source: str, start: str, end: str) -> str:
    head = source.index(start)
    return source[head:source.index(end, head)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
@pytest.mark.parametrize(("kernel", "threads"), [("wgmma hoisted", 256),
                                                 ("wgmma hoisted", 512),
                                                 ("warp-specialize hoisted", 0)])
@pytest.mark.parametrize("point", [(256, 128, 64), (128, 256, 64), (64, 64, 64),
                                   (128, 128, 128), (64, 512, 64)],
                         ids=lambda p: "x".join(map(str, p)))
def test_hoisted_copies_place_chunks_where_the_checked_copy_does(
    kernel, threads, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    """address-hoisting's copy of an inside tile, compiled for the host from the printed
    kernel: each copier thread (all PT_THREADS, or the producer's 128) places the same
    chunks as the checked copy (cp.async falls back to a byte copy off the GPU)."""
    source = build(cuda_seed, KERNELS[kernel], cuda_catalog, h200).source
    pieces = "\n".join((
        _between(source, "template <int BYTES>", "__device__ __forceinline__ void pt_cp_commit"),
        _between(source, "__device__ __forceinline__ int pt_swz", "// Shared-memory matrix"),
        _between(source, "// The A tile", "extern \"C\""),
    ))
    block_m, block_n, tk = point
    program = tmp_path / "copies.cpp"
    program.write_text("#include <algorithm>\n" + HARNESS % {"pieces": pieces})
    binary = tmp_path / "copies"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-DBLOCK_M={block_m}", f"-DBLOCK_N={block_n}",
                    f"-DTILE_K_SIZE={tk}", f"-DPT_THREADS={threads}", "-o", str(binary),
                    str(program)], check=True)
    assert subprocess.run([str(binary)], capture_output=True, text=True,
                          check=True).stdout.split() == ["same", "filled"]


def test_address_hoisting_needs_wgmma_and_changes_only_the_copies(
    cuda_catalog, cuda_seed, h200
):
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    with pytest.raises(InvalidPoint, match="needs the swizzled tile copies of wgmma"):
        build(cuda_seed, (*PREFIX, "address-hoisting"), loose, h200)
    plain = build(cuda_seed, WGMMA, cuda_catalog, h200)
    hoisted = build(cuda_seed, KERNELS["wgmma hoisted"], cuda_catalog, h200)
    assert "pt_wg_copy_inside" in hoisted.source and "pt_wg_copy_inside" not in plain.source
    assert hoisted.launch == plain.launch and hoisted.constraints == plain.constraints
    with pytest.raises(InvalidPoint, match="applied twice"):
        apply_transformation(hoisted, loose["address-hoisting"], h200)


def test_tma_needs_wgmma_and_asks_the_backend_for_two_maps(cuda_catalog, cuda_seed, h200):
    assert cuda_catalog["tma"].requires == ("wgmma",)
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    with pytest.raises(InvalidPoint, match="needs the swizzled stages of wgmma"):
        build(cuda_seed, (*PREFIX, "tma"), loose, h200)
    plain = build(cuda_seed, WGMMA, cuda_catalog, h200)
    loaded = build(cuda_seed, KERNELS["wgmma tma"], cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="applied twice"):
        apply_transformation(loaded, loose["tma"], h200)
    assert "tma_A" not in plain.source and "cp.async.bulk.tensor" not in plain.source
    assert "const void *__restrict__ tma_A, const void *__restrict__ tma_B)" in loaded.source
    assert loaded.launch == {**plain.launch, "tma_A": "BLOCK_M, 64, 128",
                             "tma_B": "TILE_K_SIZE, 64, 128",
                             "shared_bytes": plain.launch["shared_bytes"] + " + 16 * NUM_STAGES"}
    point = {**POINT, "M": 4096, "N": 4096, "K": 4096}
    boxes = tensor_map_boxes(loaded.launch, point, ["A", "B", "C"])
    assert [(b.buffer, b.rows, b.cols, b.swizzle) for b in boxes] == [
        ("A", 256, 64, 128), ("B", 64, 64, 128)]
    assert not all(evaluate_bool(c, {**POINT, "TILE_K_SIZE": 512}) for c in loaded.constraints)


@pytest.mark.parametrize("kernel", ["wgmma tma", "warp-specialize tma"])
def test_tma_kernels_keep_the_cp_async_copies_for_matrices_without_maps(
    kernel, cuda_catalog, cuda_seed, h200
):
    """One thread issues the tile copies, which a byte-counting mbarrier waits for; the
    cp.async copies stay, for a null map."""
    source = build(cuda_seed, KERNELS[kernel], cuda_catalog, h200).source
    kernel_text = source.split('extern "C"')[1]
    for ptx in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile",
                ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4]",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "fence.proxy.tensormap::generic.acquire"):
        assert ptx in source, ptx
    assert "const bool pt_tma = tma_A != nullptr && tma_B != nullptr" in kernel_text
    tma_part, copy_part = kernel_text.split("if (pt_tma)", 1)[1].split("pt_wg_copy_a", 1)
    assert "pt_tma_tiles" in tma_part and "pt_tma_tiles" not in copy_part
    assert "pt_bar_init(&pt_full[s], " + (
        "pt_tma ? 1 : PT_LOADERS" if kernel == "warp-specialize tma" else "1") in kernel_text


def test_the_mma_warpgroups_fence_for_the_tensor_cores_only_after_cp_async_copies(
    cuda_catalog, cuda_seed, h200
):
    """cp.async copies are the generic proxy's writes: their reader fences before the
    tensor cores read the stage. TMA's writes are the async proxy's own: a TMA kernel's
    MMA warpgroups fence only where it fell back to the copies (no map)."""
    fence = "pt_fence_async_smem(); // the landed tile is visible to the tensor cores"
    copies = build(cuda_seed, KERNELS["warp-specialize"], cuda_catalog, h200).source
    tma = build(cuda_seed, KERNELS["warp-specialize tma"], cuda_catalog, h200).source
    assert any(line.strip() == fence for line in copies.splitlines())
    assert any(line.strip() == f"if (!pt_tma) {fence}" for line in tma.splitlines())
    assert not any(line.strip() == fence for line in tma.splitlines())


@pytest.mark.parametrize("order", ["launch-bounds first", "launch-bounds last"])
def test_launch_bounds_that_starve_a_wgmma_of_registers_are_pruned(
    order, cuda_catalog, cuda_seed, h200
):
    """Two blocks of 256 threads per SM leave 128 registers a thread: fewer than a
    m64n256 wgmma's 128 accumulators and its addressing."""
    sequence = (("refactor", "launch-bounds", *WGMMA[1:]) if order == "launch-bounds first"
                else (*WGMMA, "launch-bounds"))
    context = build(cuda_seed, sequence, cuda_catalog, h200)
    point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 3}
    assert all(evaluate_bool(c, {**point, "MIN_BLOCKS_PER_SM": 1})
               for c in context.constraints)
    assert not all(evaluate_bool(c, {**point, "MIN_BLOCKS_PER_SM": 2})
                   for c in context.constraints)


@needs_nvrtc
def test_ptxas_refusing_an_instruction_for_registers_is_an_invalid_point(
    cuda_catalog, cuda_seed, h200, tmp_path
):
    """Built anyway (as an LLM's kernel would be), the point is pruned, not an error."""
    context = build(cuda_seed, (*WGMMA, "launch-bounds"), cuda_catalog, h200)
    point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 3,
             "MIN_BLOCKS_PER_SM": 2}
    with pytest.raises(InvalidPoint, match=r"128 registers a thread .* fewer than one "
                                           r"instruction needs"):
        CudaBackend(h200).compile(context, point, "float16", str(tmp_path))


# ------------------------------------------------------------------ persistent

PERSISTENT = {"persistent": (*SPECIALISED, "persistent"),
              "persistent tma hoisted": (*SPECIALISED, "tma", "address-hoisting", "persistent")}
_TILE_LOOP = "for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x)"


def test_persistent_blocks_walk_the_output_tiles_one_block_per_sm(cuda_catalog, cuda_seed,
                                                                   h200):
    context = build(cuda_seed, PERSISTENT["persistent tma hoisted"], cuda_catalog, h200)
    kernel = context.source.split('extern "C"')[1]
    # the TMA issuer, the cp.async producer and the MMA warpgroups walk the same tiles
    assert kernel.count(_TILE_LOOP) == 3
    assert "blockIdx.y" not in kernel
    assert kernel.count("for (int t = 0; t < tiles; ++t, ++it)") == 3
    assert "pt_bar_wait(&pt_full[it % PT_STAGES], (it / PT_STAGES) & 1);" in kernel
    # the output tile's last stage is released for the next tile's copies
    assert "if (tiles > 0 && wl % 32 == 0) pt_bar_arrive(&pt_empty[(it - 1) % PT_STAGES]);" \
        in kernel
    consumers = kernel.split("pt_cp_wait_all(); // the copies land")[1]
    assert consumers.index(_TILE_LOOP) < consumers.index("acc[i] = 0.f;")  # per tile
    for size, blocks in ((4096, 132), (512, 8)):  # 128 x 256 tiles
        point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}
        shape = evaluate_launch(context.launch, {**point, "M": size, "N": size, "K": size,
                                                 "SMS": 132})
        assert shape.grid == (blocks, 1, 1)
        assert shape.block == (128 * 3, 1, 1)  # unchanged: 2 MMA warpgroups + the producer


def test_persistent_needs_the_producer_and_excludes_split_k(cuda_catalog, cuda_seed, h200):
    with pytest.raises(InvalidPoint, match="warp-specialize"):
        build(cuda_seed, (*WGMMA, "persistent"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="split"):
        build(cuda_seed, (*PERSISTENT["persistent"], "split-k"), cuda_catalog, h200)
    plan = Plan(shared=True, mma=True, stages=True, vector_a=True, vector_b=True, wgmma=True,
                producer=True, persistent=True)
    assert load_plan(dump_plan(plan)) == plan


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(PERSISTENT))
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4},
    {**POINT, "NUM_STAGES": 3}], ids=_shape)
def test_persistent_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    context = build(cuda_seed, PERSISTENT[kernel], cuda_catalog, h200)
    artifact = CudaBackend(h200).compile(context, point, "float16", str(tmp_path))
    assert artifact.resources["registers"] > 0 and artifact.resources["stack_bytes"] == 0


# ------------------------------------------------------------------ register-budget

BUDGETED = {"budget": (*SPECIALISED, "register-budget"),
            "budget tma persistent": (*SPECIALISED, "tma", "register-budget", "persistent")}


def test_register_budget_moves_the_producers_registers_to_the_mma_warpgroups(
        cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, BUDGETED["budget tma persistent"], cuda_catalog, h200)
    kernel = context.source.split('extern "C"')[1]
    producer, consumers = kernel.split("if (wg == PT_CONSUMERS) {")[1].split(
        "pt_cp_wait_all(); // the copies land")
    # the producer warpgroup lowers its budget first, before the TMA issuer branches off
    assert producer.index("pt_regs_dec<PRODUCER_REGS>();") < producer.index("if (pt_tma)")
    assert consumers.index("pt_regs_inc<PT_MMA_REGS>();") < consumers.index("acc[i] = 0.f;")
    assert "setmaxnreg.inc.sync.aligned.u32" in context.source
    assert "#define PT_MMA_REGS (PT_MMA_FIT < 256 ? PT_MMA_FIT : 256)" in context.source
    assert [p.name for p in context.params][-1] == "PRODUCER_REGS"  # the tuner's choice
    with pytest.raises(InvalidPoint, match="warp-specialize"):
        build(cuda_seed, (*WGMMA, "register-budget"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="launch"):
        build(cuda_seed, (*BUDGETED["budget"], "launch-bounds"), cuda_catalog, h200)


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(BUDGETED))
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4},
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 4}], ids=_shape)
def test_register_budget_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    """At 72 registers the producer's cp.async copies fit (at 40 they spill)."""
    context = build(cuda_seed, BUDGETED[kernel], cuda_catalog, h200)
    artifact = CudaBackend(h200).compile(context, {**point, "PRODUCER_REGS": 72}, "float16",
                                         str(tmp_path))
    assert artifact.resources["registers"] > 0 and artifact.resources["stack_bytes"] == 0


@needs_nvrtc
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4},
    {**POINT, "BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3}], ids=_shape)
def test_the_register_budget_divides_the_registers_the_block_holds(
    point, cuda_catalog, cuda_seed, h200, tmp_path
):
    """setmaxnreg.inc waits for registers that the block's own dec freed: asking for more
    than the block holds hung the 256x128 kernel (5 warpgroups) on an H100. ptxas gives
    the kernel its launch bounds' most registers; the budget must divide exactly those."""
    context = build(cuda_seed, BUDGETED["budget tma persistent"], cuda_catalog, h200)
    for producer in (40, 72):
        values = {**point, "PRODUCER_REGS": producer}
        artifact = CudaBackend(h200).compile(context, values, "float16", str(tmp_path))
        entry = artifact.resources["registers"]  # what each thread holds at launch
        # the kernel's own macros against that count, checked by the compiler
        checked = dataclasses.replace(context, source=context.source + (
            f"\nstatic_assert(PT_ENTRY_REGS == {entry}, \"entry registers\");"
            f"\nstatic_assert(PRODUCER_REGS + PT_CONSUMERS * PT_MMA_REGS <= "
            f"(PT_CONSUMERS + 1) * {entry} && PT_MMA_REGS >= {entry}, \"budget\");"))
        CudaBackend(h200).compile(checked, values, "float16", str(tmp_path))


def test_a_producer_budget_above_what_a_thread_holds_is_pruned_before_a_build(
        cuda_catalog, cuda_seed, h200):
    """At 640 threads a thread holds 96 registers: a producer 'lowered' to more is not
    a point (the dec would be an increase)."""
    context = build(cuda_seed, BUDGETED["budget"], cuda_catalog, h200)
    point = {**POINT, "BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3}
    broken = [c for c in context.constraints
              if not evaluate_bool(c, {**point, "PRODUCER_REGS": 104})]
    assert broken and "PRODUCER_REGS" in broken[0]
    assert all(evaluate_bool(c, {**point, "PRODUCER_REGS": 96}) for c in context.constraints)


# ------------------------------------------------------------------ cluster-multicast

CLUSTERED = {"cluster tma": (*SPECIALISED, "tma", "cluster-multicast"),
             "cluster tma persistent": (*SPECIALISED, "tma", "cluster-multicast", "persistent"),
             "budget cluster tma persistent": (*SPECIALISED, "tma", "register-budget",
                                               "persistent", "cluster-multicast")}


def test_cluster_multicast_shares_each_b_tile_between_the_blocks_of_a_cluster(
        cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, CLUSTERED["cluster tma"], cuda_catalog, h200)
    head, kernel = context.source.split('extern "C"')
    assert "__cluster_dims__(CLUSTER_M, 1, 1) __launch_bounds__(PT_THREADS)" in kernel
    assert "multicast::cluster" in head and "mapa.shared::cluster.u32" in head
    # the TMA issuer loads its A tile and its share of B into every block of the cluster
    assert ("pt_tma_tiles_cluster(PT_STAGE(s), tma_A, tma_B, bm, bn, k_lo + t * PT_TK, "
            "&pt_full[s], pt_rank);") in kernel
    assert "pt_tma_tiles(" not in kernel
    # every block's MMA warps release the stage in every block, the last one too
    assert "pt_bar_init(&pt_empty[s], 4 * PT_CONSUMERS * CLUSTER_M);" in kernel
    assert "pt_bar_arrive(&pt_empty" not in kernel
    # lane r of each MMA warp arrives in block r, the arrivals of a warp at once
    assert ("if (tiles > 0 && wl % 32 < CLUSTER_M) pt_bar_arrive_remote(&pt_empty[(tiles - 1) "
            "% PT_STAGES], wl % 32);") in kernel
    assert "release.cluster.shared::cluster" not in head
    # the barriers exist before any block touches another's; a block outlives the releases
    init = kernel.split("pt_fence_barrier_init();")[1]
    assert init.index("pt_cluster_sync();") < init.index("if (wg == PT_CONSUMERS)")
    assert kernel.count("for (int i = tiles; i < tiles + PT_STAGES; ++i)") == 2  # tma, cp.async
    assert "const int block_m = cluster_m * CLUSTER_M + pt_rank;" in kernel
    # clusters of blocks along x: 16 columns of 2 blocks, 16 cluster rows of 2 block rows
    point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "CLUSTER_M": 2}
    shape = evaluate_launch(context.launch, {**point, "M": 4096, "N": 4096, "K": 4096})
    assert shape.grid == (32, 16, 1)
    assert tensor_map_boxes(context.launch, {**point, "M": 4096, "N": 4096, "K": 4096},
                            ("A", "B", "C"))[1].rows == 32  # TILE_K_SIZE / CLUSTER_M
    odd = evaluate_launch(context.launch, {**point, "CLUSTER_M": 4, "M": 200, "N": 136,
                                           "K": 64})
    assert odd.grid == (4, 1, 1)  # 2 block rows in a cluster of 4: two blocks store nothing


def test_persistent_clusters_walk_their_tiles_together(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, CLUSTERED["budget cluster tma persistent"], cuda_catalog, h200)
    kernel = context.source.split('extern "C"')[1]
    assert kernel.count("for (int tile = blockIdx.x / CLUSTER_M; tile < cluster_rows * "
                        "tiles_n; tile += gridDim.x / CLUSTER_M)") == 3
    assert kernel.count("for (int i = it; i < it + PT_STAGES; ++i)") == 2
    for cluster, blocks in ((2, 132), (4, 132)):  # whole clusters, at most one block per SM
        point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "CLUSTER_M": cluster}
        shape = evaluate_launch(context.launch, {**point, "M": 4096, "N": 4096, "K": 4096,
                                                 "SMS": 132})
        assert shape.grid == (blocks, 1, 1)
    small = evaluate_launch(context.launch, {**POINT, "CLUSTER_M": 4, "M": 1100, "N": 128,
                                             "K": 64, "SMS": 132})
    assert small.grid == (8, 1, 1)  # 5 block rows of 256: 2 cluster rows of 4, 1 column


def test_cluster_multicast_needs_the_tma_producer_and_excludes_split_k(
        cuda_catalog, cuda_seed, h200):
    with pytest.raises(InvalidPoint, match="requires tma"):
        build(cuda_seed, (*SPECIALISED, "cluster-multicast"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="requires warp-specialize"):
        build(cuda_seed, (*WGMMA, "tma", "cluster-multicast"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="TMA producer"):  # the rule itself, as a plan
        RULES["cluster-multicast"](Plan(shared=True, mma=True, stages=True, vector_a=True,
                                        vector_b=True, wgmma=True, producer=True), h200)
    with pytest.raises(InvalidPoint, match="split"):
        build(cuda_seed, (*CLUSTERED["cluster tma"], "split-k"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="split"):
        build(cuda_seed, (*SPECIALISED, "tma", "split-k", "cluster-multicast"), cuda_catalog,
              h200)
    context = build(cuda_seed, CLUSTERED["cluster tma"], cuda_catalog, h200)
    share = [c for c in context.constraints if "CLUSTER_M" in c]
    assert share and not evaluate_bool(share[0], {**POINT, "TILE_K_SIZE": 64, "CLUSTER_M": 16})
    assert load_plan(context.state) == load_plan(dump_plan(load_plan(context.state)))


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(CLUSTERED))
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4, "CLUSTER_M": 2},
    {**POINT, "NUM_STAGES": 3, "CLUSTER_M": 4}], ids=_shape)
def test_cluster_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    resources = _built(CLUSTERED[kernel], point, cuda_catalog, cuda_seed, h200, tmp_path)
    assert resources["registers"] > 0 and resources["stack_bytes"] == 0


def _built(sequence, point, cuda_catalog, cuda_seed, h200, tmp_path):
    """The compiler's resources of `sequence` built at `point` (the producer at 72
    registers, where its cp.async copies fit), fp16 for sm_90a."""
    context = build(cuda_seed, sequence, cuda_catalog, h200)
    values = {"SK_DOWNWARDS": 1, **point, "PRODUCER_REGS": 72}
    return CudaBackend(h200).compile(
        context, {p.name: values[p.name] for p in context.params}, "float16",
        str(tmp_path)).resources


# ------------------------------------------------------------------ tma-store

STORED = {"tma store": (*SPECIALISED, "tma", "tma-store"),
          "budget cluster tma store persistent": (*SPECIALISED, "tma", "register-budget",
                                                  "cluster-multicast", "tma-store",
                                                  "persistent")}


def test_tma_store_sends_c_through_swizzled_slabs(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, STORED["tma store"], cuda_catalog, h200)
    head, kernel = context.source.split('extern "C"')
    assert "const void *__restrict__ tma_B, const void *__restrict__ tma_C)" in kernel
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in head
    assert ("#define PT_SMEM_ELEMS (PT_STAGES * (PT_A_TILE + PT_B_TILE) + PT_C_SLABS)"
            in head)
    piece = kernel.split("for (int p = 0; p < WGMMA_N / 64; ++p) {")[1]
    # written swizzled (one 16-byte chunk per row of a warp's 8), stored once written
    write = ("*reinterpret_cast<unsigned *>(slab + r * 64 + ((j ^ (r % 8)) << 3) + t2) = "
             "pt_pack2((DTYPE)acc[a], (DTYPE)acc[a + 1]);")
    assert piece.index("pt_wg_sync(wg);") < piece.index(write) < piece.index(
        "pt_fence_async_smem();") < piece.index("if (pt_tma_c) {")
    stored, copied = piece.split("if (pt_tma_c) {")[1].split("else {", 1)
    assert "if (wl == 0) pt_tma_store(slab, tma_C, bn + wn + p * 64, bm + wm);" in stored
    assert "C[" not in stored
    # unmapped C: the threads copy the slab out inside C, in a rolled loop (cheap to
    # build); the accumulators are written once, to the slab
    assert "for (int e = wl; e < 64 * 8; e += 128) {" in copied
    assert ("if (row < M && col + q < N) C[(size_t)row * N + col + q] = src[q];" in copied)
    assert "acc[" not in copied and "pt_pack2((DTYPE)acc" not in kernel.replace(write, "")
    assert kernel.rstrip().endswith("if (pt_tma_c && wl == 0) pt_tma_store_wait_all(); "
                                    "// the slabs stay until their stores are done\n}")
    point = {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}
    names = {**point, "M": 4096, "N": 4096, "K": 4096}
    plain_bytes = evaluate_launch(build(cuda_seed, (*SPECIALISED, "tma"), cuda_catalog,
                                        h200).launch, names).shared_bytes
    assert evaluate_launch(context.launch, names).shared_bytes == plain_bytes + 2 * 16384
    boxes = tensor_map_boxes(context.launch, names, ("A", "B", "C"))
    assert [(b.buffer, b.rows, b.cols, b.swizzle) for b in boxes][2] == ("C", 64, 64, 128)


def test_tma_store_needs_the_tma_producer_and_excludes_split_k(cuda_catalog, cuda_seed,
                                                                h200):
    with pytest.raises(InvalidPoint, match="requires tma"):
        build(cuda_seed, (*SPECIALISED, "tma-store"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="split"):
        build(cuda_seed, (*STORED["tma store"], "split-k"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="tma-store applied twice"):
        build(cuda_seed, (*STORED["tma store"], "tma-store"), cuda_catalog, h200)


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(STORED))
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4, "CLUSTER_M": 2},
    {**POINT, "BLOCK_M": 64, "BLOCK_N": 64, "WGMMA_N": 64, "NUM_STAGES": 3, "CLUSTER_M": 4}],
    ids=_shape)
def test_tma_store_kernels_build_for_sm_90a_within_shared_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    """128 x 256 tiles in 4 stages and their slabs still fit the 227 KiB of a block."""
    resources = _built(STORED[kernel], point, cuda_catalog, cuda_seed, h200, tmp_path)
    assert resources["registers"] > 0 and resources["stack_bytes"] == 0


# ------------------------------------------------------------------ ping-pong

PING_PONG = {"ping-pong": (*PERSISTENT["persistent"], "ping-pong"),
             "budget tma store ping-pong": (*SPECIALISED, "tma", "register-budget",
                                            "tma-store", "persistent", "ping-pong")}
_GROUP_LOOP = ("for (int tile = blockIdx.x + grp * gridDim.x, n = 0; tile < tiles_m * tiles_n; "
               "tile += 2 * gridDim.x, it += tiles, ++n)")


def test_ping_pong_groups_take_the_output_tiles_in_turn(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, PING_PONG["budget tma store ping-pong"], cuda_catalog, h200)
    head, kernel = context.source.split('extern "C"')
    assert "#define PT_MMA_WGS (2 * PT_CONSUMERS)" in head
    assert "#define PT_THREADS (128 * (PT_MMA_WGS + 1))" in head
    assert "#define PT_C_SLABS (PT_MMA_WGS * 2 * 64 * 64)" in head  # slabs per warpgroup
    assert "/ PT_MMA_WGS / 8 * 8)" in head  # the budget shares among all MMA warpgroups
    # a warpgroup's place in its group sets its tile; the producer comes after both groups
    assert "const int grp = wg / PT_CONSUMERS, wc = wg % PT_CONSUMERS;" in kernel
    assert "wm = wc / PT_WG_COLS * 64, wn = wc % PT_WG_COLS * WGMMA_N;" in kernel
    producer, consumers = kernel.split("if (wg == PT_MMA_WGS) {")[1].split(
        "pt_regs_inc<PT_MMA_REGS>();")
    assert producer.count(_TILE_LOOP) == 2  # TMA and cp.async: every tile, in order
    assert _GROUP_LOOP not in producer
    # the groups: own tiles, `it` starting at the group's first and skipping the other's
    assert consumers.index("it = grp * tiles;") < consumers.index(_GROUP_LOOP)
    body = consumers.split(_GROUP_LOOP)[1]
    wait = "if (grp > 0 || n > 0) pt_bar_wait(&pt_order[grp], (n - 1 + grp) & 1);"
    arrive = "if (wl % 32 == 0) pt_bar_arrive(&pt_order[grp ^ 1]);"
    # the order: wait for the other group's turn, wait on the stages, hand the turn over
    # once this tile's MMAs are issued, then store while the other group computes
    assert (body.index("acc[i] = 0.f;") < body.index(wait)
            < body.index("pt_bar_wait(&pt_full[it % PT_STAGES], (it / PT_STAGES) & 1);")
            < body.index(arrive) < body.index("pt_wg_wait<0>();")
            < body.index("pt_tma_store(slab"))
    # every stage is read by one group: its releases are one group's warps
    assert "pt_bar_init(&pt_empty[s], 4 * PT_CONSUMERS);" in kernel
    assert "pt_bar_init(&pt_order[1], 4 * PT_CONSUMERS);" in kernel
    assert "PT_SMEM_ELEMS * sizeof(DTYPE) + 1024 + 16 * PT_STAGES + 16) __trap();" in kernel


def test_ping_pong_launches_twice_the_mma_warpgroups(cuda_catalog, cuda_seed, h200):
    point = {**POINT, "BLOCK_M": 64, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4,
             "PRODUCER_REGS": 72}
    names = {**point, "M": 4096, "N": 4096, "K": 4096, "SMS": 132}
    stored = build(cuda_seed, STORED["tma store"] + ("register-budget", "persistent"),
                   cuda_catalog, h200)
    context = build(cuda_seed, PING_PONG["budget tma store ping-pong"], cuda_catalog, h200)
    before, after = evaluate_launch(stored.launch, names), evaluate_launch(context.launch, names)
    assert before.block == (128 * 2, 1, 1) and after.block == (128 * 3, 1, 1)
    assert after.grid == before.grid == (132, 1, 1)
    # the order barriers and the second group's slabs
    assert after.shared_bytes == before.shared_bytes + 16 + 16384
    ties = [c for c in context.constraints]
    assert not all(evaluate_bool(c, {**point, "BLOCK_M": 128}) for c in ties)  # 640 threads
    assert all(evaluate_bool(c, point) for c in ties)
    assert not all(evaluate_bool(c, {**point, "PRODUCER_REGS": 200}) for c in ties)


def test_ping_pong_needs_persistent_and_composes_with_clusters(cuda_catalog, cuda_seed,
                                                              h200):
    with pytest.raises(InvalidPoint, match="persistent"):
        build(cuda_seed, (*SPECIALISED, "ping-pong"), cuda_catalog, h200)
    # with clusters, the groups take the cluster's tiles in turn
    clustered = build(cuda_seed, (*SPECIALISED, "tma", "persistent", "cluster-multicast",
                                  "ping-pong"), cuda_catalog, h200).source
    assert ("for (int tile = blockIdx.x / CLUSTER_M + grp * (gridDim.x / CLUSTER_M), n = 0; "
            "tile < cluster_rows * tiles_n; tile += 2 * (gridDim.x / CLUSTER_M), it += tiles, "
            "++n)") in clustered
    assert ("for (int tile = blockIdx.x / CLUSTER_M; tile < cluster_rows * tiles_n; "
            "tile += gridDim.x / CLUSTER_M)") in clustered  # the producer: every one
    with pytest.raises(InvalidPoint, match="ping-pong applied twice"):
        build(cuda_seed, (*PING_PONG["ping-pong"], "ping-pong"), cuda_catalog, h200)
    # the other Hopper steps compose after it as before it
    late = build(cuda_seed, (*SPECIALISED, "persistent", "ping-pong", "tma", "register-budget",
                             "tma-store"), cuda_catalog, h200)
    early = build(cuda_seed, PING_PONG["budget tma store ping-pong"], cuda_catalog, h200)
    assert late.source == early.source
    plan = Plan(shared=True, mma=True, stages=True, vector_a=True, vector_b=True, wgmma=True,
                producer=True, persistent=True, pingpong=True)
    assert load_plan(dump_plan(plan)) == plan
    assert '"pingpong"' not in dump_plan(plan.but(pingpong=False))


@needs_nvrtc
@pytest.mark.parametrize("kernel", list(PING_PONG))
@pytest.mark.parametrize("point", [
    {**POINT, "BLOCK_M": 64, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4},
    {**POINT, "BLOCK_M": 64, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 6}], ids=_shape)
def test_ping_pong_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    resources = _built(PING_PONG[kernel], point, cuda_catalog, cuda_seed, h200, tmp_path)
    assert resources["registers"] > 0 and resources["stack_bytes"] == 0


# ------------------------------------------------------------------ stream-k

STREAM_K = {"stream-k": (*PERSISTENT["persistent"], "stream-k"),
            "budget tma store stream-k": (*SPECIALISED, "tma", "register-budget", "tma-store",
                                          "persistent", "stream-k")}
_UNIT_LOOP = ("for (int n = 0, tile, kb, ke; pt_sk_unit(n, tiles_m * tiles_n, tiles, tile, "
              "kb, ke); ++n)")


def test_stream_k_walks_units_and_hands_partial_sums_over(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, STREAM_K["budget tma store stream-k"], cuda_catalog, h200)
    head, kernel = context.source.split('extern "C"')
    assert "__device__ float4 pt_sk_sums[PT_SK_SLOTS * (BLOCK_M * BLOCK_N / 4)];" in head
    assert "ld.acquire.gpu.global.u32" in head and head.count("void pt_wg_sync(") == 1
    # the TMA issuer, the cp.async producer and the MMA warpgroups walk the same units,
    # each over the unit's K tiles; no role walks whole tiles any more
    assert kernel.count(_UNIT_LOOP) == 3 and _TILE_LOOP not in kernel
    assert kernel.count("for (int i = kb, t = pt_sk_k(i, kb, ke); i < ke; ++i, "
                        "t = pt_sk_k(i, kb, ke), ++it)") == 3
    assert "if (gridDim.x > PT_SK_SLOTS) __trap();" in kernel
    consumers = kernel.split("pt_regs_inc<PT_MMA_REGS>();")[1]
    assert "if (i > kb && wl % 32 == 0) pt_bar_arrive(&pt_empty[(it - 1) % PT_STAGES]);" \
        in consumers
    # after the unit's MMAs: a piece without the tile's first K tile leaves its sums and
    # stores nothing; the holder of the first K tile adds the rest, then stores C
    body = consumers.split(_UNIT_LOOP)[1]
    save = body.index("pt_sk_save(acc, wg, wl);")
    assert (body.index("pt_wg_wait<0>();") < body.index("if (kb > 0) {") < save
            < body.index("continue;", save)
            < body.index("if (ke < tiles) pt_sk_gather(acc, tile, tiles_m * tiles_n, tiles, "
                         "wg, wl);")
            < body.index("pt_tma_store(slab"))
    # the launch stays one block per SM
    assert context.launch["grid_x"] == "min(ceil_div(M, BLOCK_M) * ceil_div(N, BLOCK_N), SMS)"


def test_stream_k_needs_persistent_and_excludes_ping_pong_and_clusters(cuda_catalog,
                                                                       cuda_seed, h200):
    with pytest.raises(InvalidPoint, match="persistent"):
        build(cuda_seed, (*SPECIALISED, "stream-k"), cuda_catalog, h200)
    with pytest.raises(InvalidPoint, match="stream-k applied twice"):
        build(cuda_seed, (*STREAM_K["stream-k"], "stream-k"), cuda_catalog, h200)
    for other in ("ping-pong", "cluster-multicast"):
        with pytest.raises(InvalidPoint):
            build(cuda_seed, (*SPECIALISED, "tma", "persistent", other, "stream-k"),
                  cuda_catalog, h200)
        with pytest.raises(InvalidPoint):
            build(cuda_seed, (*SPECIALISED, "tma", "persistent", "stream-k", other),
                  cuda_catalog, h200)
    # the other Hopper steps compose after it as before it
    late = build(cuda_seed, (*SPECIALISED, "persistent", "stream-k", "tma", "register-budget",
                             "tma-store"), cuda_catalog, h200)
    early = build(cuda_seed, STREAM_K["budget tma store stream-k"], cuda_catalog, h200)
    assert late.source == early.source
    assert "stream-k" in cuda_catalog and cuda_catalog["stream-k"].requires == ("persistent",)


_UNITS_MAIN = r"""
#include <cstdio>
int main() {
    int total, ktiles, grid;
    while (std::scanf("%d %d %d", &total, &ktiles, &grid) == 3) {
        gridDim.x = grid;
        for (int b = 0; b < grid; ++b) {
            blockIdx.x = b;
            std::printf("block %d %lld %lld\n", b, pt_sk_lo(b, total, ktiles),
                        pt_sk_lo(b + 1, total, ktiles));
            int tile, kb, ke;
            for (int n = 0; pt_sk_unit(n, total, ktiles, tile, kb, ke); ++n) {
                std::printf("unit %d %d %d %d %d\n", b, n, tile, kb, ke);
                std::printf("steps %d", b);
                for (int i = kb; i < ke; ++i) std::printf(" %d", pt_sk_k(i, kb, ke));
                std::printf("\n");
            }
        }
        std::printf("end\n");
    }
}
"""


def _stream_k_units(source: str, cases: list[tuple[int, int, int]],
                    tmp_path: Path, downwards: int = 1) -> list[dict]:
    """The kernel's own pt_sk_dp / pt_sk_lo / pt_sk_unit / pt_sk_k, built for the host
    with the grid and block numbers as globals and SK_DOWNWARDS = `downwards`, run over
    `cases` (tiles, K tiles, blocks)."""
    helpers = source.split("// Output tiles dealt out whole")[1].split(
        "// Warpgroup wg's sums")[0]
    minimum_run = next(line for line in source.splitlines()
                       if line.startswith("#define PT_SK_MIN_RUN"))
    shim = (f"#include <algorithm>\nusing std::min, std::max;\n{minimum_run}\n"
            f"#define SK_DOWNWARDS {downwards}\n"
            "struct Dim { unsigned x; };\n"
            "static Dim gridDim, blockIdx;\n#define __device__\n#define __forceinline__ inline\n"
            "#define PT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))\n")
    program = tmp_path / f"units{downwards}"
    program.with_suffix(".cpp").write_text(shim + "// Output tiles" + helpers + _UNITS_MAIN)
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(program),
                    str(program.with_suffix(".cpp"))], check=True)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                         input="".join(f"{t} {k} {g}\n" for t, k, g in cases)).stdout
    runs: list[dict] = []
    current: dict = {"runs": {}, "units": [], "steps": {}}
    for line in out.splitlines():
        word, *numbers = line.split()
        if word == "end":
            runs.append(current)
            current = {"runs": {}, "units": [], "steps": {}}
        elif word == "block":
            current["runs"][int(numbers[0])] = (int(numbers[1]), int(numbers[2]))
        elif word == "steps":  # the K tiles of the unit just printed, in the order computed
            current["steps"].setdefault(int(numbers[0]), []).append(
                [int(k) for k in numbers[1:]])
        else:
            current["units"].append(tuple(map(int, numbers)))
    return runs


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler (g++)")
@pytest.mark.parametrize("downwards", [1, 0], ids=["downwards", "upwards"])
def test_stream_k_units_cover_every_k_tile_once_and_every_hand_over_has_a_taker(
    cuda_catalog, cuda_seed, h200, tmp_path, downwards
):
    """What the kernel's unit walk gives, built from its source: every K tile of every
    output tile computed exactly once; a block leaves sums only from its first unit; the
    holder of a tile's first K tile gathers exactly from the blocks that left sums of it
    (the non-empty runs starting inside the tile, pt_sk_gather's walk); whole-wave tiles
    are dealt out whole."""
    source = build(cuda_seed, STREAM_K["stream-k"], cuda_catalog, h200).source
    # 4096 at 128 x 256 on 132 SMs; tiles spread over three blocks and more; a remainder
    # of one tile over many blocks (empty runs); K = 0; no partial wave; fewer tiles than SMs
    cases = [(512, 64, 132), (162, 16, 132), (133, 3, 132), (140, 1, 132), (300, 0, 132),
             (264, 64, 132), (40, 7, 40), (1000, 5, 114), (133, 64, 132), (144, 4, 132),
             (2048, 128, 132)]
    walks = _stream_k_units(source, cases, tmp_path, downwards)
    for (total, ktiles, grid), walk in zip(cases, walks, strict=True):
        dp = total // grid * grid if ktiles else total
        seen: dict[tuple[int, int], int] = {}
        givers: dict[int, set[int]] = {}
        for block, n, tile, kb, ke in walk["units"]:
            assert 0 <= kb < ke <= ktiles or (ktiles == 0 and kb == ke == 0)
            if tile < dp:
                assert (kb, ke) == (0, ktiles) and tile % grid == block
            if kb > 0:  # leaves sums: only its first piece of the partial wave
                assert n == dp // grid and block not in givers.setdefault(tile, set())
                givers[tile].add(block)
            for k in range(kb, ke):
                seen[(tile, k)] = seen.get((tile, k), 0) + 1
            if ktiles == 0:
                seen[(tile, 0)] = seen.get((tile, 0), 0) + 1
        expected = {(t, k) for t in range(total) for k in range(max(ktiles, 1))}
        assert set(seen) == expected and set(seen.values()) == {1}, (total, ktiles, grid)
        for block, _, tile, kb, ke in walk["units"]:
            if kb == 0 and ke < ktiles:  # the holder of K tile 0 that must gather
                end = (tile - dp + 1) * ktiles
                takes = {c for c in range(block + 1, grid)
                         if walk["runs"][c][0] < end and walk["runs"][c][1] > walk["runs"][c][0]}
                assert takes == givers.pop(tile), (total, ktiles, grid, tile)
        assert not givers  # every sum left behind is taken
        for (block, _, _, kb, ke), steps in zip(
                walk["units"], (s for b in sorted(walk["steps"]) for s in walk["steps"][b]),
                strict=True):
            order = range(ke - 1, kb - 1, -1) if downwards else range(kb, ke)
            assert steps == list(order), (total, ktiles, grid, block)
        # runs of at least PT_SK_MIN_RUN K tiles where the partial wave has enough of them,
        # and never fewer blocks than its tiles
        sizes = [hi - lo for lo, hi in walk["runs"].values() if hi > lo]
        left = total - dp
        if left and ktiles:
            assert len(sizes) >= min(grid, left)
            if left * ktiles >= 8 * grid:
                assert len(sizes) == grid
            elif len(sizes) > left:
                assert min(sizes) >= 8, (total, ktiles, grid, sizes)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler (g++)")
def test_stream_k_blocks_walk_the_shared_wave_at_nearly_the_same_k_tiles(
    cuda_catalog, cuda_seed, h200, tmp_path
):
    """The shared wave's blocks, stepping together, read nearly the same K tiles of A and
    B at each step (as a wave of whole tiles does, from L2) when walked downwards
    (SK_DOWNWARDS 1): within ktiles - L + 1 K tiles, L the shortest run; at 4096 (runs of
    56 of 64 K tiles) within 9, where walking each piece upwards (SK_DOWNWARDS 0) spreads
    them over all 64."""
    source = build(cuda_seed, STREAM_K["stream-k"], cuda_catalog, h200).source
    cases = [(512, 64, 132), (2048, 128, 132), (1024, 64, 132), (600, 64, 132),
             (256, 64, 132), (1000, 5, 114)]
    for (total, ktiles, grid), walk in zip(cases, _stream_k_units(source, cases, tmp_path),
                                           strict=True):
        shortest, widest = _shared_wave_spread(walk, total // grid)
        assert widest <= ktiles - shortest + 1, (total, ktiles, grid, widest, shortest)
        if (total, ktiles) == (512, 64):
            assert (shortest, widest) == (56, 9)
    upwards = _stream_k_units(source, cases[:1], tmp_path, downwards=0)[0]
    assert _shared_wave_spread(upwards, 512 // 132) == (56, 64)


def _shared_wave_spread(walk: dict, whole: int) -> tuple[int, int]:
    """(the shortest run of the shared wave, the most K tiles apart its blocks are at one
    step): the units before `whole` are whole tiles, all at the same K tile."""
    shared = [[k for steps in walk["steps"][b][whole:] for k in steps]
              for b in sorted(walk["steps"])]
    shared = [run for run in shared if run]
    shortest = min(len(run) for run in shared)
    widest = max(max(at) - min(at) + 1 for at in (
        [run[s] for run in shared if s < len(run)] for s in range(shortest)))
    return shortest, widest


@needs_nvrtc
@pytest.mark.parametrize(("kernel", "point"), [
    # 4096's winner; without register-budget its 168 registers a thread spill 8 bytes
    ("budget tma store stream-k",
     {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4}),
    ("budget tma store stream-k",  # walked upwards
     {**POINT, "BLOCK_M": 128, "BLOCK_N": 256, "WGMMA_N": 256, "NUM_STAGES": 4,
      "SK_DOWNWARDS": 0}),
    ("budget tma store stream-k",
     {**POINT, "BLOCK_M": 64, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 6}),
    ("stream-k", {**POINT, "BLOCK_M": 64, "BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 6})],
    ids=lambda v: _shape(v) if isinstance(v, dict) else v)
def test_stream_k_kernels_build_for_sm_90a_without_local_memory(
    kernel, point, cuda_catalog, cuda_seed, h200, tmp_path
):
    """The unit walk's integer arithmetic stays 32-bit: a 64-bit division is a called
    subroutine around which the MMA warpgroups spilled (24 bytes at 128 x 256)."""
    resources = _built(STREAM_K[kernel], point, cuda_catalog, cuda_seed, h200, tmp_path)
    assert resources["registers"] > 0 and resources["stack_bytes"] == 0
