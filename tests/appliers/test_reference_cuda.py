"""The reference applier on the CUDA matmul: real transformations, real NVRTC builds.

Every transformation applies after a minimal legal prefix; sequences in several orders,
the paper's fp32 sequence and an fp16 tensor-core sequence build with NVRTC for sm_80
and sm_90 at each parameter's first and last values (nudged until the constraints and
the launch limits hold). Without NVRTC (pip wheels, see tests/backends/test_cuda_compile)
the build tests skip with the reason. Correctness on a GPU: benchmarks/cuda_reference_check.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.appliers.reference.cuda_matmul import (
    CudaMatmul,
    apply_transformation,
    plan_of,
)
from peak_tune.backends._cuda_launch import check_launch, evaluate_launch
from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError, CompileError, InvalidPoint
from peak_tune.expr import evaluate_bool
from tests.appliers.conftest import build_cuda as build
from tests.appliers.conftest import minimal_prefix
from tests.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"
PAPER_FP32 = ("refactor", "tb-tiling", "thread-tiling", "thread-cache", "warp-tiling",
              "transpose", "offset", "vector-loads", "pipelining", "block-swizzle")
TENSOR_FP16 = ("refactor", "tb-tiling", "tensor-core", "tensor-tiling", "offset",
               "vector-loads", "ldmatrix", "pipelining", "block-swizzle", "launch-bounds")
ORDERS = (  # the same or overlapping steps in different legal orders
    ("refactor", "split-k", "block-swizzle", "tb-tiling", "register-staging", "thread-tiling",
     "thread-chunk", "thread-cache"),
    ("refactor", "thread-tiling", "thread-cache", "tb-tiling", "vector-loads", "transpose",
     "register-staging", "split-k"),
    ("refactor", "tb-tiling", "transpose", "vector-loads", "pipelining", "thread-tiling",
     "thread-chunk", "warp-tiling", "launch-bounds"),
    ("refactor", "warp-tiling", "tb-tiling", "offset", "pipelining", "split-k"),
    ("refactor", "tb-tiling", "transpose", "tensor-core", "ldmatrix", "register-staging",
     "split-k", "vector-loads"),
    ("refactor", "block-swizzle", "tb-tiling", "pipelining", "tensor-core", "vector-loads",
     "tensor-tiling", "offset"),
    ("refactor", "thread-tiling", "tb-tiling", "register-staging", "double-buffer",
     "vector-loads", "transpose", "thread-cache"),
    ("refactor", "tb-tiling", "interior-tiles", "pipelining", "vector-loads", "thread-tiling",
     "launch-bounds"),
    # the double-buffered loop's tile counter beside the MMA epilogue's own t (a search
    # on an H100 hit "t has already been declared" 1-3 times a study before)
    ("refactor", "tb-tiling", "tensor-core", "register-staging", "double-buffer",
     "block-swizzle"),
)
TENSOR_STEPS = {"tensor-core", "tensor-tiling", "ldmatrix", "wgmma"}
# every CUDA transformation: the NVIDIA-only ones and those written for CUDA and HIP alike
CUDA_IDS = [p.stem for folder in ("cuda", "gpu")
            for p in sorted((ROOT / "transforms" / folder).glob("*.md"))]
SIZES = {"M": 512, "N": 512, "K": 512}


def _violations(context: KernelContext, values: Mapping[str, int], shared_kib: float) -> float:
    """0 for a legal point; grows with the number of broken constraints and with how far
    the block exceeds the thread and shared-memory limits (so single steps can improve)."""
    broken = float(sum(not evaluate_bool(c, values) for c in context.constraints))
    try:
        shape = evaluate_launch(context.launch, {**SIZES, **values, "SMS": 132})
    except InvalidPoint:
        return broken + 100.0
    threads, shared = shape.threads / 1024, shape.shared_bytes / (shared_kib * 1024 - 64)
    return broken + max(0.0, math.log2(threads)) + max(0.0, math.log2(max(shared, 1e-9)))


def tuning_point(context: KernelContext, end: int, device: DeviceProfile) -> dict[str, int]:
    """Each parameter's first (end 0) or last (end -1) value, then nudged one parameter at
    a time toward the other end until every constraint and launch limit holds."""
    shared_kib = float(device.facts["shared_memory_per_block_kib"])
    values = {p.name: p.values[end] for p in context.params}
    orders = {p.name: list(p.values) if end == 0 else list(reversed(p.values))
              for p in context.params}
    for _ in range(4):
        if _violations(context, values, shared_kib) == 0:
            return values
        for p in reversed(context.params):
            best = min(orders[p.name], key=lambda v: _violations(
                context, {**values, p.name: v}, shared_kib))
            values[p.name] = best
    if _violations(context, values, shared_kib) == 0:
        return values
    # where two parameters must move together (ping-pong: BLOCK_N with WGMMA_N), the
    # first legal point in the order of the values from this end
    for combination in itertools.product(*orders.values()):
        point = dict(zip(orders, combination, strict=True))
        if _violations(context, point, shared_kib) == 0:
            return point
    raise AssertionError(f"no legal point near {values}")


def dtypes_of(context: KernelContext) -> tuple[str, ...]:
    return ("float16",) if TENSOR_STEPS & set(context.applied) else ("float32", "float16")


_BUILT: set[tuple[str, str, str, str]] = set()


def assert_builds(context: KernelContext, tmp_path: Path) -> None:
    """NVRTC builds, per dtype, at the first values for sm_80 and the last for sm_90a
    (each architecture and each end once: the front end, where a sequence's mistakes
    show, sees both ends; the largest tiles' builds are the slow ones), two at a time
    (each build is a process of its own), as a search's compile workers do. wgmma is
    sm_90a code (the rule refuses other targets): both ends there."""
    wgmma = "wgmma" in context.applied
    builds = []
    for device, end in (("h200", 0) if wgmma else ("a100", 0), ("h200", -1)):
        profile = load_device(DEVICES / f"{device}.toml")
        backend = CudaBackend(profile)
        values = tuning_point(context, end, profile)
        for dtype in dtypes_of(context):
            key = (context.content_hash(), repr(sorted(values.items())), dtype, device)
            if key not in _BUILT:
                builds.append((key, backend, values, dtype))

    def built(key: tuple[str, ...], backend: CudaBackend, values: dict[str, int],
              dtype: str) -> tuple[str, ...]:
        artifact = backend.compile(context, values, dtype, str(tmp_path))
        assert artifact.resources.get("registers", 0) > 0
        return key

    with ThreadPoolExecutor(2) as pool:
        for key in pool.map(lambda build: built(*build), builds):
            _BUILT.add(key)


# ---------------------------------------------------------------- the catalog


def test_catalog_is_fully_implemented_and_registered(cuda_catalog):
    assert len(cuda_catalog) >= 14
    applier = ReferenceApplier()
    for tid, transformation in cuda_catalog.items():
        assert CudaMatmul().implements(tid), tid
        assert applier.implements("cuda", "matmul", tid), tid
        assert transformation.backends in (("cuda",), ("cuda", "hip"), ("cuda", "hip", "hlsl"))
        for backend in transformation.backends:
            assert applier.implements(backend, "matmul", tid), (backend, tid)
        assert transformation.passes[0].region in ("macros", "device")


def test_texts_use_only_device_facts_every_cuda_profile_has(cuda_catalog):
    profiles = [load_device(path) for path in sorted(DEVICES.glob("*.toml"))]
    facts = set.intersection(*(set(p.facts) for p in profiles if p.backend == "cuda"))
    for tid, transformation in cuda_catalog.items():
        for step in transformation.passes:
            names = set(re.findall(r"\{([^{}]*)\}", step.text))
            assert names <= facts, f"{tid}: unknown placeholders {names - facts}"
            assert not re.search(r"[{}]", re.sub(r"\{\w+\}", "", step.text)), tid


def test_launch_passes_match_the_transformations_that_change_the_geometry(
    cuda_catalog, cuda_seed, h200
):
    for tid in cuda_catalog:
        parent = build(cuda_seed, minimal_prefix(tid, cuda_catalog), cuda_catalog, h200)
        child = apply_transformation(parent, cuda_catalog[tid], h200)
        has_launch_pass = any(p.region == "launch" for p in cuda_catalog[tid].passes)
        assert has_launch_pass == (child.launch != parent.launch), tid


# ---------------------------------------------------------------- each step


@pytest.mark.parametrize("tid", CUDA_IDS)
def test_each_transformation_applies_after_its_prefix(tid, cuda_catalog, cuda_seed, h200):
    parent = build(cuda_seed, minimal_prefix(tid, cuda_catalog), cuda_catalog, h200)
    child = apply_transformation(parent, cuda_catalog[tid], h200)
    assert child.applied == parent.applied + (tid,)
    assert child.source != parent.source
    assert child.lineage is not None and child.lineage.parent_hash == parent.content_hash()
    assert {p.name for p in cuda_catalog[tid].params} <= {p.name for p in child.params}
    names = set(SIZES) | {p.name for p in child.params}
    check_launch(child.launch, names)
    for macro in (p.name for p in child.params):
        assert f"#ifndef {macro}" in child.source, macro
    assert plan_of(child) is not None  # the state reloads and reprints to the same source


@needs_nvrtc
@pytest.mark.parametrize("tid", CUDA_IDS)
def test_each_transformation_builds_with_nvrtc(tid, cuda_catalog, cuda_seed, h200, tmp_path):
    context = build(cuda_seed, minimal_prefix(tid, cuda_catalog) + [tid], cuda_catalog, h200)
    assert_builds(context, tmp_path)


def test_refactor_sets_a_block_tile_geometry(cuda_catalog, cuda_seed, h200):
    child = apply_transformation(cuda_seed, cuda_catalog["refactor"], h200)
    shape = evaluate_launch(child.launch, {"M": 67, "N": 53, "K": 97, "BLOCK_M": 32,
                                           "BLOCK_N": 16})
    assert shape.grid == (4, 3, 1) and shape.block == (16, 32, 1) and shape.shared_bytes == 0


def test_paper_fp32_geometry_and_constraints(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, PAPER_FP32, cuda_catalog, h200)
    values = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 16, "TRD_Y_DIM": 8, "TRD_X_DIM": 8,
              "WARP_X_DIM": 4, "OFFSET_AMOUNT": 4, "NUM_STAGES": 3, "SWIZZLE_GROUP": 8}
    assert all(evaluate_bool(c, values) for c in context.constraints)
    shape = evaluate_launch(context.launch, {**values, "M": 4096, "N": 4096, "K": 4096})
    assert shape.block == (16, 16, 1) and shape.grid == (32, 32, 1)
    assert shape.shared_bytes == 3 * (16 * 132 + 16 * 132) * 4  # dynamic: over 48 KiB
    assert "(BLOCK_M // TRD_Y_DIM) * (BLOCK_N // TRD_X_DIM) <= 1024" in context.constraints
    assert not evaluate_bool("(BLOCK_N // TRD_X_DIM) % WARP_X_DIM == 0",
                             {**values, "WARP_X_DIM": 32})
    small = {**values, "NUM_STAGES": 2, "BLOCK_M": 64}
    assert evaluate_launch(context.launch, {**small, "M": 64, "N": 64, "K": 64}
                           ).shared_bytes == 0  # fits static shared memory


@needs_nvrtc
@pytest.mark.parametrize("sequence", [PAPER_FP32, TENSOR_FP16, *ORDERS],
                         ids=lambda s: "+".join(s))
def test_sequences_build_with_nvrtc(sequence, cuda_catalog, cuda_seed, h200, tmp_path):
    assert_builds(build(cuda_seed, sequence, cuda_catalog, h200), tmp_path)


@needs_nvrtc
def test_tensor_core_fails_to_build_for_fp32_with_a_clear_message(
    cuda_catalog, cuda_seed, h200, tmp_path
):
    context = build(cuda_seed, ("refactor", "tb-tiling", "tensor-core"), cuda_catalog, h200)
    with pytest.raises(CompileError) as caught:
        CudaBackend(h200).compile(context, tuning_point(context, 0, h200), "float32",
                                  str(tmp_path))
    assert "tensor-core needs DTYPE __half or __nv_bfloat16" in caught.value.detail


# ---------------------------------------------------------------- order, determinism


def test_two_orders_give_different_source(cuda_catalog, cuda_seed, h200):
    prefix = ("refactor", "tb-tiling")
    first = build(cuda_seed, prefix + ("transpose", "vector-loads"), cuda_catalog, h200)
    second = build(cuda_seed, prefix + ("vector-loads", "transpose"), cuda_catalog, h200)
    assert first.source != second.source
    # vectorised after the transpose, A's copy stays element-wise; before it, A keeps
    # its 16-byte global loads and scatters them into the transposed tile
    assert "pt_copy_a(as, A, K, bm, M, k0, k_hi, tid);" in first.source
    assert "pt_copy_a(as, A, K, bm, M, k0, k_hi, tid, true);" in second.source


def test_commuting_steps_give_the_same_kernel(cuda_catalog, cuda_seed, h200):
    one = build(cuda_seed, ("refactor", "split-k", "block-swizzle"), cuda_catalog, h200)
    other = build(cuda_seed, ("refactor", "block-swizzle", "split-k"), cuda_catalog, h200)
    assert one.source == other.source and one.launch == other.launch


def test_application_is_deterministic(cuda_catalog, cuda_seed, h200):
    one = build(cuda_seed, TENSOR_FP16, cuda_catalog, h200)
    two = build(cuda_seed, TENSOR_FP16, cuda_catalog, h200)
    assert one.content_hash() == two.content_hash() and one.state == two.state


# ---------------------------------------------------------------- illegal picks, foreign input


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (("tb-tiling",), "requires refactor"),
        (("refactor", "refactor"), "applied twice"),
        (("refactor", "warp-tiling", "thread-tiling"), "conflicts with warp-tiling"),
        (("refactor", "tb-tiling", "thread-tiling", "tensor-core"), "conflicts with thread-tiling"),
        (("refactor", "tb-tiling", "register-staging", "pipelining"), "conflicts with register"),
        (("refactor", "tensor-tiling"), "requires tensor-core"),
    ],
)
def test_illegal_sequences_raise_invalid_point(sequence, message, cuda_catalog, cuda_seed, h200):
    with pytest.raises(InvalidPoint, match=message):
        build(cuda_seed, sequence, cuda_catalog, h200)


def test_rules_check_their_preconditions_on_the_kernel(cuda_catalog, cuda_seed, h200):
    """Without the catalog's requires/conflicts, the rule itself refuses."""
    refactored = apply_transformation(cuda_seed, cuda_catalog["refactor"], h200)
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    with pytest.raises(InvalidPoint, match="tensor-core needs the shared-memory tiles"):
        apply_transformation(refactored, loose["tensor-core"], h200)
    with pytest.raises(InvalidPoint, match="thread-cache needs the thread tiles"):
        apply_transformation(refactored, loose["thread-cache"], h200)
    with pytest.raises(InvalidPoint, match="needs the block-tile form of refactor"):
        apply_transformation(cuda_seed, loose["split-k"], h200)


def test_split_k_declares_its_counter_table_as_a_size_constraint(cuda_catalog, cuda_seed, h200):
    context = build(cuda_seed, ("refactor", "split-k"), cuda_catalog, h200)
    (constraint,) = context.size_constraints
    values = {"BLOCK_M": 16, "BLOCK_N": 16}
    assert evaluate_bool(constraint, {**values, "M": 257, "N": 293})
    assert not evaluate_bool(constraint, {**values, "M": 16384, "N": 16384})
    assert context.launch["grid_z"] == "K_SPLITS"


def test_foreign_or_edited_variants_are_apply_errors(cuda_catalog, cuda_seed, h200):
    child = apply_transformation(cuda_seed, cuda_catalog["refactor"], h200)
    edited = dataclasses.replace(child, source=child.source.replace("acc[i][j] = 0;",
                                                                      "acc[i][j] = 1;"))
    with pytest.raises(ApplyError, match="source was changed"):
        apply_transformation(edited, cuda_catalog["tb-tiling"], h200)
    relaunched = dataclasses.replace(child, launch={**child.launch, "block_x": "64"})
    with pytest.raises(ApplyError, match="launch was changed"):
        apply_transformation(relaunched, cuda_catalog["tb-tiling"], h200)
    odd_seed = dataclasses.replace(cuda_seed, source=cuda_seed.source.replace("B[k * N + col]",
                                                                    "B[col * N + k]"))
    with pytest.raises(ApplyError, match="accumulates something other"):
        apply_transformation(odd_seed, cuda_catalog["refactor"], h200)
    c_context = dataclasses.replace(cuda_seed, backend="c")
    with pytest.raises(ApplyError, match="cannot apply to c/matmul"):
        apply_transformation(c_context, cuda_catalog["refactor"], h200)


def test_registry_never_drops_the_launch_geometry(cuda_catalog, cuda_seed, h200):
    """Through ReferenceApplier: the same child as apply_transformation, or (while its
    ReferenceKernel protocol cannot carry a launch) an ApplyError saying so."""
    expected = apply_transformation(cuda_seed, cuda_catalog["refactor"], h200)
    try:
        child = ReferenceApplier().apply(cuda_seed, cuda_catalog["refactor"], h200)
    except ApplyError as exc:
        assert "CudaChange" in str(exc)
    else:
        assert child.content_hash() == expected.content_hash()


def test_double_buffer_alternates_two_buffers_with_one_barrier_per_tile(
    cuda_catalog, cuda_seed, h200
):
    staged_steps = ("refactor", "tb-tiling", "register-staging", "thread-tiling")
    staged = build(cuda_seed, staged_steps, cuda_catalog, h200)
    doubled = build(cuda_seed, (*staged_steps, "double-buffer"), cuda_catalog, h200)
    loops = [src.split("for (int k0 = k_lo")[1].split("#pragma unroll\n    for (int i")[0]
             for src in (staged.source, doubled.source)]
    assert [loop.count("__syncthreads()") for loop in loops] == [2, 1]
    assert "pt_put_a(PT_STAGE((t + 1) & 1), ra, tid);" in loops[1]
    assert "#define PT_STAGES 2" in doubled.source and "#define PT_STAGES 1" in staged.source
    point = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "TRD_Y_DIM": 8,
             "TRD_X_DIM": 8, **SIZES}  # 32 KiB of tiles: static once, dynamic twice
    assert evaluate_launch(staged.launch, point).shared_bytes == 0
    assert evaluate_launch(doubled.launch, point).shared_bytes == 2 * 32768
    loose = {tid: dataclasses.replace(t, requires=(), conflicts=())
             for tid, t in cuda_catalog.items()}
    with pytest.raises(InvalidPoint, match="needs the register-staged copies"):
        build(cuda_seed, ("refactor", "tb-tiling", "double-buffer"), loose, h200)


def test_interior_tiles_adds_an_unchecked_k_loop_in_front(cuda_catalog, cuda_seed, h200):
    """Interior blocks run a K loop whose copies get edge = false; edge blocks (and rows
    that are not 16-byte aligned) keep the checked loops; the checks honour the flag."""
    steps = ("refactor", "tb-tiling", "thread-tiling", "register-staging", "vector-loads")
    checked = build(cuda_seed, steps, cuda_catalog, h200)
    interior = build(cuda_seed, (*steps, "interior-tiles"), cuda_catalog, h200)
    assert "edge" not in checked.source
    body = interior.source.split("const bool edge = ")[1]
    assert body.startswith("bm + BLOCK_M > M || bn + BLOCK_N > N || (k_hi - k_lo) % PT_TK != 0;")
    loops = body.split("for (int k0 = k_lo;")
    assert len(loops) == 4  # unchecked + 16-byte, checked + 16-byte, checked elements
    assert "if (vec && !edge)" in loops[0] and "else if (vec)" in loops[1]
    assert "pt_fetch_a(ra, A, K, bm, M, k0 + PT_TK, k_hi, tid, true, false);" in loops[1]
    assert "pt_fetch_a(ra, A, K, bm, M, k0 + PT_TK, k_hi, tid, true, true);" in loops[2]
    assert "pt_fetch_b(rb, B, N, k0 + PT_TK, k_hi, bn, N, tid, false, true);" in loops[3]
    assert "const bool full = !edge || (row_in && col0 + c + PT_VEC <= col_hi);" in (
        interior.source)
    plain = build(cuda_seed, ("refactor", "tb-tiling", "interior-tiles"), cuda_catalog, h200)
    assert "if (!edge)" in plain.source and "pt_copy_a(as, A, K, bm, M, k0, k_hi, tid, false);" in (
        plain.source)
    for first, then in (("interior-tiles", "wgmma"), ("wgmma", "interior-tiles")):
        with pytest.raises(InvalidPoint, match="interior-tiles"):
            build(cuda_seed, ("refactor", "tb-tiling", "tensor-core", "pipelining",
                              "vector-loads", first, then), cuda_catalog, h200)
