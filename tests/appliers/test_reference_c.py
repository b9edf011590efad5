"""The reference applier on the C matmul: real transformations, real compiles, odd sizes."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pytest

from peak_tune.appliers.reference import IDENTITY, ReferenceApplier
from peak_tune.appliers.reference.c_matmul import emit_source, nest_of
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError, InvalidPoint
from peak_tune.expr import evaluate_bool
from tests.appliers.conftest import minimal_prefix

# Small tiles so the odd test sizes cross many blocks and edges; they satisfy every tie
# (MC % MR, NC % NR, NR a multiple of 16 floats).
SMALL = {"MC": 24, "NC": 48, "KC": 16, "MR": 6, "NR": 16, "UNROLL_K": 4,
         "PREFETCH_DIST": 4, "OMP_CHUNK": 1, "K_SPLITS": 3}
# Values from the catalog's domains.
DOMAIN = {"MC": 32, "NC": 128, "KC": 64, "MR": 8, "NR": 32, "UNROLL_K": 8,
          "PREFETCH_DIST": 8, "OMP_CHUNK": 2, "K_SPLITS": 2}
ALL_IN_ORDER = (
    "loop-interchange", "cache-blocking", "openmp-parallel", "block-interchange",
    "register-blocking", "tile-interchange", "pack-a", "pack-b", "simd-vectorize",
    "unroll-k", "prefetch", "restrict-align", "k-split",
)
Compiler = Callable[..., Callable[..., None]]


def build(seed: KernelContext, sequence: Sequence[str], catalog: Mapping[str, Transformation],
          device: DeviceProfile) -> KernelContext:
    applier = ReferenceApplier()
    context = seed
    for tid in sequence:
        context = applier.apply(context, catalog[tid], device)
    return context


def values_for(context: KernelContext, table: Mapping[str, int]) -> dict[str, int]:
    values = {p.name: table[p.name] for p in context.params}
    for constraint in context.constraints:
        assert evaluate_bool(constraint, values), f"test values break {constraint!r}"
    return values


@pytest.fixture
def assert_correct(compiler: Compiler, check: Callable[..., None]) -> Callable[..., None]:
    """assert_correct(context, table=SMALL, dtype="float32"): compile and check odd sizes."""

    def run(context: KernelContext, table: Mapping[str, int] = SMALL,
            dtype: str = "float32") -> None:
        check(compiler(context.source, values_for(context, table), dtype), dtype)

    return run


def test_catalog_is_fully_implemented(transformations, seed):
    applier = ReferenceApplier()
    assert len(transformations) >= 10
    for tid in transformations:
        assert applier.implements("c", "matmul", tid), tid


@pytest.mark.parametrize("tid", sorted(ALL_IN_ORDER))
def test_each_transformation_applies_and_stays_correct(tid, transformations, seed, device,
                                                       assert_correct):
    parent = build(seed, minimal_prefix(tid, transformations), transformations, device)
    child = ReferenceApplier().apply(parent, transformations[tid], device)
    assert child.source != parent.source
    assert child.applied == parent.applied + (tid,)
    assert child.lineage is not None
    assert child.lineage.parent_hash == parent.content_hash()
    assert child.lineage.applier == IDENTITY
    assert child.lineage.transform_text_hash == transformations[tid].text_hash()
    names = {p.name for p in child.params}
    for param in transformations[tid].params:
        assert param.name in names
        assert f"#ifndef {param.name}" in child.source
        assert child.source.count(param.name) > 3, f"{param.name} declared but not used"
    assert_correct(child)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_all_transformations_in_one_order(dtype, transformations, seed, device, assert_correct):
    context = build(seed, ALL_IN_ORDER, transformations, device)
    assert set(context.applied) == set(transformations)
    assert_correct(context, SMALL, dtype)
    assert_correct(context, DOMAIN, dtype)


PAIRS = [
    ("loop-interchange", "cache-blocking"),
    ("loop-interchange", "unroll-k"),
    ("loop-interchange", "prefetch"),
    ("cache-blocking", "register-blocking"),
    ("cache-blocking", "openmp-parallel"),
    ("register-blocking", "simd-vectorize"),
    ("openmp-parallel", "k-split"),
    ("openmp-parallel", "block-interchange"),
    ("pack-a", "register-blocking"),
    ("pack-b", "openmp-parallel"),
]


@pytest.mark.parametrize("first,second", PAIRS)
def test_pairs_in_both_orders_are_correct(first, second, transformations, seed, device,
                                          assert_correct):
    for pair in ((first, second), (second, first)):
        prefix = [s for p in pair for s in minimal_prefix(p, transformations)]
        prefix = list(dict.fromkeys(prefix))
        context = build(seed, prefix + list(pair), transformations, device)
        assert_correct(context)


@pytest.mark.parametrize("sequences", [
    (("loop-interchange", "cache-blocking"), ("cache-blocking", "loop-interchange")),
    (("cache-blocking", "openmp-parallel", "block-interchange"),
     ("cache-blocking", "block-interchange", "openmp-parallel")),
    (("register-blocking", "tile-interchange", "openmp-parallel"),
     ("register-blocking", "openmp-parallel", "tile-interchange")),
])
def test_orders_of_one_set_give_different_code(sequences, transformations, seed, device,
                                               assert_correct):
    one, other = (build(seed, s, transformations, device) for s in sequences)
    assert set(one.applied) == set(other.applied)
    assert one.source != other.source
    assert one.state != other.state
    for context in (one, other):
        assert_correct(context)


def random_legal_sequence(rng: random.Random, seed: KernelContext,
                          catalog: Mapping[str, Transformation], device: DeviceProfile
                          ) -> KernelContext:
    applier, context = ReferenceApplier(), seed
    for _ in range(rng.randint(2, len(catalog))):
        options = [t for t in sorted(catalog) if t not in context.applied]
        rng.shuffle(options)
        for tid in options:
            try:
                context = applier.apply(context, catalog[tid], device)
                break
            except InvalidPoint:
                continue
    return context


@pytest.mark.parametrize("rng_seed", range(6))
def test_random_legal_sequences_are_correct(rng_seed, transformations, seed, device,
                                            assert_correct):
    context = random_legal_sequence(random.Random(rng_seed), seed, transformations, device)
    assert len(context.applied) >= 2
    assert_correct(context, SMALL if rng_seed % 2 else DOMAIN,
                   "float64" if rng_seed == 5 else "float32")


@pytest.mark.parametrize("sequence,reason", [
    (("pack-a",), "requires cache-blocking"),
    (("block-interchange",), "requires cache-blocking"),
    (("tile-interchange",), "requires register-blocking"),
    (("register-blocking", "loop-interchange"), "conflicts with register-blocking"),
    (("unroll-k", "unroll-k"), "applied twice"),
    (("cache-blocking", "cache-blocking"), "applied twice"),
])
def test_illegal_picks_are_invalid_points(sequence, reason, transformations, seed, device):
    with pytest.raises(InvalidPoint, match=reason):
        build(seed, sequence, transformations, device)


def test_ir_preconditions_beyond_front_matter(transformations, seed, device):
    """A conflict the catalog does not declare is still caught from the loop nest."""
    undeclared = replace(transformations["loop-interchange"], conflicts=())
    tiled = build(seed, ["register-blocking"], transformations, device)
    with pytest.raises(InvalidPoint, match="register tile"):
        ReferenceApplier().apply(tiled, undeclared, device)


def test_order_dependent_ties_become_constraints(transformations, seed, device):
    tiled = build(seed, ["register-blocking"], transformations, device)
    assert "MC % MR == 0" not in tiled.constraints
    both = build(seed, ["register-blocking", "cache-blocking"], transformations, device)
    assert {"MC % MR == 0", "NC % NR == 0"} <= set(both.constraints)
    vector = build(seed, ["simd-vectorize", "register-blocking"], transformations, device)
    lanes = int(device.facts["vector_bits"]) // 32
    assert f"NR % {lanes} == 0" in vector.constraints
    assert not build(seed, ["simd-vectorize"], transformations, device).constraints


def test_applier_is_deterministic(transformations, seed, device):
    one = build(seed, ALL_IN_ORDER, transformations, device)
    two = build(seed, ALL_IN_ORDER, transformations, device)
    assert one == two and one.content_hash() == two.content_hash()


def test_samples_do_not_change_the_result(transformations, seed, device):
    applier = ReferenceApplier()
    blocking = transformations["cache-blocking"]
    assert applier.apply(seed, blocking, device, 0) == applier.apply(seed, blocking, device, 7)


def test_unknown_combinations_are_apply_errors(transformations, seed, device):
    applier = ReferenceApplier()
    with pytest.raises(ApplyError, match="'opencl'.*'matmul'"):
        applier.apply(replace(seed, backend="opencl"), transformations["unroll-k"], device)
    unknown = replace(transformations["unroll-k"], id="warp-tiling")
    with pytest.raises(ApplyError, match="warp-tiling"):
        applier.apply(seed, unknown, device)


def test_only_the_seed_or_own_variants_continue(transformations, seed, device):
    applier = ReferenceApplier()
    child = applier.apply(seed, transformations["cache-blocking"], device)
    foreign = replace(child, state="")  # e.g. an LLM applier's child
    with pytest.raises(ApplyError, match="seed or its own variants"):
        applier.apply(foreign, transformations["unroll-k"], device)
    edited = replace(child, source=child.source.replace("MC", "MC2", 1))
    with pytest.raises(ApplyError, match="seed or its own variants"):
        applier.apply(edited, transformations["unroll-k"], device)
    broken = child.state.replace('"register_tile":false', '"register_tile":true')
    with pytest.raises(ApplyError, match="not a valid nest"):
        applier.apply(replace(child, state=broken), transformations["unroll-k"], device)
    not_a_seed = replace(seed, source=seed.source.replace("acc +=", "acc -="))
    with pytest.raises(ApplyError, match="seed"):
        applier.apply(not_a_seed, transformations["unroll-k"], device)


def test_params_must_match_the_implementation(transformations, seed, device):
    renamed = replace(transformations["unroll-k"],
                      params=(replace(transformations["unroll-k"].params[0], name="UNROLL"),))
    with pytest.raises(ApplyError, match="UNROLL_K"):
        ReferenceApplier().apply(seed, renamed, device)


def test_vectorising_needs_a_vector_width(transformations, seed, device):
    unknown = replace(device, facts={**device.facts, "vector_bits": "detect"})
    with pytest.raises(ApplyError, match="vector_bits"):
        ReferenceApplier().apply(seed, transformations["simd-vectorize"], unknown)


def test_seed_is_lifted_from_its_loops(transformations, seed, device, assert_correct):
    """A seed whose i and j loops are swapped lifts to a j-outer nest and keeps it."""
    lines = seed.source.splitlines()
    i_line = next(n for n, line in enumerate(lines) if "int i = 0" in line)
    j_line = next(n for n, line in enumerate(lines) if "int j = 0" in line)
    indent_i = lines[i_line][: len(lines[i_line]) - len(lines[i_line].lstrip())]
    indent_j = lines[j_line][: len(lines[j_line]) - len(lines[j_line].lstrip())]
    lines[i_line], lines[j_line] = (indent_i + lines[j_line].strip(),
                                    indent_j + lines[i_line].strip())
    swapped = replace(seed, source="\n".join(lines))
    assert [loop.dim for loop in nest_of(swapped).loops] == ["j", "i", "k"]
    context = build(swapped, ["cache-blocking", "register-blocking"], transformations, device)
    assert [(loop.dim, loop.level) for loop in nest_of(context).loops][:3] == [
        ("j", "block"), ("i", "block"), ("k", "block")]
    assert_correct(context)


def test_state_round_trips(transformations, seed, device):
    context = build(seed, ALL_IN_ORDER, transformations, device)
    assert emit_source(nest_of(context), context.entry) == context.source
