"""The kernel plan: an IR of a block-tiled GPU matmul, and its JSON form (KernelContext.state).

One plan prints as CUDA or, from the HIP seed (`hip`), as HIP: the SIMT parts are the
same in both; the NVIDIA-only parts (NVIDIA_ONLY) cannot be in a HIP plan, the AMD-only
ones (AMD_ONLY: MFMA) only in one. From the HLSL seed (`hlsl`) it prints as a compute
shader (reference/hlsl_matmul), with the SIMT parts of HLSL_PARTS only.

After `refactor` the kernel always has the same skeleton, and each transformation
changes one part of it. The plan records, part by part, what the code looks like:

- block position: plain (blockIdx.x over N, .y over M) or grouped (`swizzle`), or, in a
  persistent warpgroup kernel (`persistent`), one block per SM walking the output tiles,
  those of the last partial wave shared out as runs of K tiles (`stream_k`);
- K range: the whole of K, or one of K_SPLITS slices chosen by blockIdx.z (`split_k`);
- operands: read from global memory, or staged through shared-memory tiles (`shared`),
  with A stored transposed, rows padded, 16-byte copies per operand, copies staged in
  registers (into one shared buffer or two in turn) or issued with cp.async into
  NUM_STAGES buffers, bounds-checked everywhere or only in blocks at the edge (`interior`);
- compute: SIMT (one output per thread, or a TRD_Y_DIM x TRD_X_DIM thread tile, laid out
  contiguously or strided, fragments cached in registers, lanes arranged per warp,
  in HLSL the fragments shared between a wave's lanes: `wave_broadcast`) or
  tensor cores (mma.sync m16n8k16, one or TENSOR_TILE_M x TENSOR_TILE_N tiles per warp,
  fragments read per element or with ldmatrix), or Hopper warpgroup MMAs (wgmma
  m64nNk16 from 128-byte-swizzled shared tiles through matrix descriptors), the tiles
  copied by all threads between barriers or by one producer warpgroup (`producer`, which
  may give most of its registers to the MMA warpgroups: `budget`),
  with cp.async or, where the backend gives tensor maps, TMA (`tma`), the B tile shared by
  the CLUSTER_M blocks of a thread-block cluster (`cluster`: each loads a share of it
  for all, TMA multicast), the MMA warpgroups in one group or in two that take the
  output tiles in turn (`pingpong`); or, on AMD GPUs,
  matrix cores (`mfma`: each wave64 computes 32 x 32 tiles with v_mfma_f32_32x32x8f16 or
  v_mfma_f32_32x32x2f32 from the shared tiles);
- epilogue: plain stores, or the split-K hand-over between slices, or (warpgroup
  kernels) TMA stores from swizzled shared slabs (`tma_store`);
- entry: with or without __launch_bounds__.

The seed (one thread per output) has no plan: it is lifted (lift.py) to NAIVE.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from peak_tune.errors import ApplyError

from ..change import read_state

__all__ = ["AMD_ONLY", "FORMAT", "HLSL_ONLY", "HLSL_PARTS", "NAIVE", "NAIVE_HIP", "NAIVE_HLSL",
           "NVIDIA_ONLY", "Plan", "dump_plan", "load_plan", "structure_problem"]

FORMAT = "peak-tune/reference/cuda-matmul/1"


@dataclass(frozen=True)
class Plan:
    """The parts of the kernel (see the module docstring). Defaults: refactor's kernel."""

    tiled: bool = True  # False only for the lifted naive seed
    shared: bool = False  # tb-tiling: A and B tiles in shared memory, TILE_K_SIZE deep
    thread_tile: bool = False  # thread-tiling: TRD_Y_DIM x TRD_X_DIM outputs per thread
    thread_cache: bool = False  # thread-cache: A/B fragments in registers per k
    strided: bool = False  # thread-chunk: a thread's outputs strided by the thread grid
    warp_tile: bool = False  # warp-tiling: lanes of a warp form a WARP_X_DIM-wide patch
    transpose_a: bool = False  # transpose: the A tile stored k-major in shared memory
    padded: bool = False  # offset: shared rows padded by OFFSET_AMOUNT elements
    vector_a: bool = False  # vector-loads: A tile copied in 16-byte pieces
    vector_b: bool = False  # vector-loads: B tile copied in 16-byte pieces
    staging: bool = False  # register-staging: next tile fetched to registers during compute
    double_buffer: bool = False  # double-buffer: the staged tiles alternate between 2 buffers
    stages: bool = False  # pipelining: NUM_STAGES buffers filled with cp.async
    split_k: bool = False  # split-k: K_SPLITS slices over blockIdx.z, serial hand-over
    swizzle: bool = False  # block-swizzle: blocks grouped SWIZZLE_GROUP rows at a time
    mma: bool = False  # tensor-core: warps compute with mma.sync m16n8k16
    mma_tiles: bool = False  # tensor-tiling: TENSOR_TILE_M x TENSOR_TILE_N MMAs per warp
    ldmatrix: bool = False  # ldmatrix: MMA fragments loaded with ldmatrix
    launch_bounds: bool = False  # launch-bounds: __launch_bounds__(threads, MIN_BLOCKS_PER_SM)
    wgmma: bool = False  # wgmma: warpgroups compute with wgmma.mma_async m64nNk16 (sm_90a)
    producer: bool = False  # warp-specialize: one warpgroup copies, mbarriers hand tiles over
    hoisted: bool = False  # address-hoisting: inside tiles copied from addresses set up once
    tma: bool = False  # tma: whole tiles loaded by the Tensor Memory Accelerator
    persistent: bool = False  # persistent: one block per SM walks the output tiles
    budget: bool = False  # register-budget: setmaxnreg moves the producer's registers to the MMAs
    # cluster-multicast: CLUSTER_M blocks of a thread-block cluster compute the output tiles
    # of one column, each TMA-loads a share of their common B tile for all of them
    cluster: bool = False
    # tma-store: the MMA warpgroups store C through swizzled shared slabs with TMA
    tma_store: bool = False
    # ping-pong: two groups of MMA warpgroups take the block's output tiles in turn, one
    # group's MMAs running while the other stores its tile
    pingpong: bool = False
    # stream-k: a persistent grid's last partial wave of output tiles is shared out as
    # even runs of K tiles, partial sums handed between blocks through a workspace
    stream_k: bool = False
    interior: bool = False  # interior-tiles: blocks inside the matrices copy unchecked
    hip: bool = False  # printed as HIP (the seed was naive.hip), not CUDA: see emit.py
    mfma: bool = False  # mfma: waves compute 32 x 32 MFMA tiles (AMD CDNA, HIP only)
    hlsl: bool = False  # printed as an HLSL compute shader (the seed was naive.hlsl)
    # cooperative-matrix: subgroups compute 16 x 16 tiles with Vulkan's cooperative
    # matrices (HLSL printed as Slang, which compiles them)
    coopmat: bool = False
    # wave-broadcast: lanes read shares of the thread-cache fragments from the groupshared
    # tiles and pass them on with WaveReadLaneAt (HLSL only)
    wave_broadcast: bool = False
    # direct-store: the cooperative-matrix tiles go straight to C; the shader then serves
    # only sizes of whole block tiles (HLSL only)
    direct_store: bool = False
    # workgroup-matrix: the whole thread group holds one BLOCK_M x BLOCK_N cooperative
    # matrix, loads its A and B tiles from the buffers and stores it to C through tensor
    # layouts (VK_NV_cooperative_matrix2's workgroup scope; HLSL only)
    workgroup_matrix: bool = False

    def but(self, **changes: bool) -> Plan:
        return replace(self, **changes)


NAIVE = Plan(tiled=False)
NAIVE_HIP = Plan(tiled=False, hip=True)
NAIVE_HLSL = Plan(tiled=False, hlsl=True)

_NAMES = tuple(f.name for f in fields(Plan))
# Flags added after the format was first written: stored only when set, so the states
# (and content hashes) of earlier variants stay as they were.
_LATER = ("wgmma", "producer", "hoisted", "tma", "double_buffer", "interior", "hip", "mfma",
          "hlsl", "coopmat", "persistent", "budget", "wave_broadcast", "direct_store",
          "cluster", "tma_store", "workgroup_matrix", "pingpong", "stream_k")
# Parts only NVIDIA GPUs have (cp.async, mma.sync, ldmatrix, wgmma, TMA): not in HIP.
NVIDIA_ONLY = ("stages", "mma", "mma_tiles", "ldmatrix", "wgmma", "producer", "hoisted",
               "tma", "persistent", "budget", "cluster", "tma_store", "pingpong",
               "stream_k")
# Parts only AMD GPUs have (the MFMA matrix cores of CDNA): only in HIP.
AMD_ONLY = ("mfma",)
# The parts an HLSL compute shader has (hlsl_matmul prints them); the rest need pointers,
# PTX, AMD builtins, a fixed warp size or spinning between thread groups, which Vulkan
# compute does not give.
HLSL_PARTS = ("tiled", "shared", "thread_tile", "thread_cache", "strided", "transpose_a",
              "padded", "vector_a", "vector_b", "staging", "double_buffer", "swizzle",
              "interior", "warp_tile", "hlsl", "coopmat", "wave_broadcast", "direct_store",
              "workgroup_matrix")
# Parts only an HLSL shader has (Vulkan's cooperative matrices, the wave intrinsics'
# fragment sharing): not in CUDA or HIP.
HLSL_ONLY = ("coopmat", "wave_broadcast", "direct_store", "workgroup_matrix")


def dump_plan(plan: Plan) -> str:
    """The plan as canonical JSON (sorted keys, no spaces)."""
    flags = {k: v for k, v in asdict(plan).items() if v or k not in _LATER}
    payload: dict[str, Any] = {"format": FORMAT, **flags}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def load_plan(text: str) -> Plan:
    """Parse a state written by dump_plan; ApplyError if it is not one."""
    payload = read_state(text, FORMAT)
    flags = {k: v for k, v in payload.items() if k != "format"}
    known = set(flags) | set(_LATER) == set(_NAMES)
    if not known or not all(isinstance(v, bool) for v in flags.values()):
        raise ApplyError("reference applier state is malformed: wrong fields or types")
    plan = Plan(**flags)
    if dump_plan(plan) != text:
        raise ApplyError("reference applier state is not in canonical form")
    problem = structure_problem(plan)
    if problem:
        raise ApplyError(f"reference applier state is not a valid plan: {problem}")
    return plan


_NEEDS: tuple[tuple[str, str], ...] = (
    ("thread_cache", "thread_tile"),
    ("strided", "thread_tile"),
    ("transpose_a", "shared"),
    ("padded", "shared"),
    ("vector_a", "shared"),
    ("vector_b", "shared"),
    ("staging", "shared"),
    ("double_buffer", "staging"),
    ("interior", "shared"),
    ("stages", "shared"),
    ("mma", "shared"),
    ("mma_tiles", "mma"),
    ("ldmatrix", "mma"),
    ("wgmma", "mma"),
    ("wgmma", "stages"),
    ("wgmma", "vector_a"),
    ("wgmma", "vector_b"),
    ("producer", "wgmma"),
    ("hoisted", "wgmma"),
    ("tma", "wgmma"),
    ("persistent", "producer"),
    ("budget", "producer"),
    ("cluster", "producer"),
    ("cluster", "tma"),
    ("tma_store", "producer"),
    ("tma_store", "tma"),
    ("pingpong", "persistent"),
    ("stream_k", "persistent"),
    ("mfma", "shared"),
    ("coopmat", "shared"),
    ("wave_broadcast", "shared"),
    ("wave_broadcast", "thread_cache"),
    ("wave_broadcast", "warp_tile"),
    ("direct_store", "coopmat"),
    ("workgroup_matrix", "coopmat"),
)
_EXCLUDES: tuple[tuple[str, str], ...] = (
    ("staging", "stages"),
    ("mma", "thread_tile"),
    ("mma", "warp_tile"),
    ("wgmma", "mma_tiles"),
    ("wgmma", "ldmatrix"),
    ("wgmma", "transpose_a"),
    ("wgmma", "padded"),
    ("wgmma", "interior"),  # its copies have their own (address-hoisting)
    ("stream_k", "pingpong"),  # its units of work are the block's, not a group's
    ("stream_k", "cluster"),  # the blocks of a cluster walk whole tiles together
    ("persistent", "split_k"),  # its grid walks the output tiles; split-k's, K slices
    ("budget", "launch_bounds"),  # its budgets are for one block per SM
    ("cluster", "split_k"),  # the slices' hand-over spins between blocks a cluster holds
    ("tma_store", "split_k"),  # later slices add to C, which a TMA store cannot
    ("mfma", "thread_tile"),
    ("mfma", "warp_tile"),
    ("coopmat", "thread_tile"),
    ("coopmat", "warp_tile"),
    ("coopmat", "transpose_a"),  # its A tiles load row-major from the groupshared tile
    ("coopmat", "padded"),  # its loads want 16-byte aligned rows
    # workgroup-matrix loads its tiles from the buffers: the groupshared copies' steps
    # would change nothing
    ("workgroup_matrix", "vector_a"),
    ("workgroup_matrix", "vector_b"),
    ("workgroup_matrix", "staging"),
    ("workgroup_matrix", "interior"),
    # its tile goes to C through a tensor layout that drops what lies outside, for any
    # size; direct-store's (whole tiles only) would be left unused
    ("workgroup_matrix", "direct_store"),
)


def structure_problem(plan: Plan) -> str:
    """What breaks the plan's invariants, or ""."""
    if not plan.tiled:
        return ("" if plan in (NAIVE, NAIVE_HIP, NAIVE_HLSL)
                else "the naive kernel has no parts to change")
    if plan.hip and plan.hlsl:
        return "a plan is printed as HIP or as HLSL, not both"
    if plan.hlsl:
        for part in _NAMES:
            if getattr(plan, part) and part not in HLSL_PARTS:
                return f"{part} has no HLSL form"
    elif plan.hip:
        for part in NVIDIA_ONLY:
            if getattr(plan, part):
                return f"{part} is NVIDIA-only (not in HIP)"
    else:
        for part in AMD_ONLY:
            if getattr(plan, part):
                return f"{part} is AMD-only (HIP, not CUDA)"
    for part in HLSL_ONLY:
        if getattr(plan, part) and not plan.hlsl:
            return f"{part} is HLSL's (not in CUDA or HIP)"
    for part, needed in _NEEDS:
        if getattr(plan, part) and not getattr(plan, needed):
            return f"{part} needs {needed}"
    for one, other in _EXCLUDES:
        if getattr(plan, one) and getattr(plan, other):
            return f"{one} and {other} exclude each other"
    return ""
