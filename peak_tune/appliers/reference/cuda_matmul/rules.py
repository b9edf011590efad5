"""The transformations as functions on the plan, one per transformation id.

Each rule does to the plan what its Markdown text (transforms/gpu/<id>.md, or
transforms/cuda/<id>.md for the NVIDIA-only steps, transforms/hip/<id>.md for the
AMD-only ones and transforms/hlsl/<id>.md for the HLSL-only ones) tells an LLM to do to the
code, and raises InvalidPoint with a one-line reason when the plan does not meet its
precondition. Ties between a transformation's parameters and earlier ones come back as
constraints; they are only added where no later legal step can change the quantity they
bind (the catalog's requires/conflicts fix that order), so they never go stale; mfma's
bound on the shared tiles is the one exception, kept because later steps (offset,
double-buffer) only add to the tiles: it stays necessary and the backend checks the
final size. The threads-per-block limit is a constraint once the thread count is final
(thread-tiling, tensor-tiling, mfma); before that the backend prunes an oversized block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from peak_tune.catalog.types import DeviceProfile
from peak_tune.errors import ApplyError, InvalidPoint

from .geometry import smem_elements, smem_unit, threads_expression
from .plan import Plan
from .snippets import SPLIT_K_TABLE_SIZE

__all__ = ["RULES", "Change", "Rule"]


@dataclass(frozen=True)
class Change:
    plan: Plan
    constraints: tuple[str, ...] = ()
    size_constraints: tuple[str, ...] = ()


Rule = Callable[[Plan, DeviceProfile], Change]


def _fact(device: DeviceProfile, name: str, default: int) -> int:
    value = device.facts.get(name, default)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ApplyError(f"device {device.name!r}: fact {name} = {value!r} is not a count")
    return value


def _threads_limit(plan: Plan, device: DeviceProfile) -> str:
    fact = "max_threads_per_group" if plan.hlsl else "max_threads_per_block"  # Vulkan's word
    return f"{threads_expression(plan)} <= {_fact(device, fact, 1024)}"


def _tiled(plan: Plan, tid: str) -> None:
    if not plan.tiled:
        raise InvalidPoint(f"{tid} needs the block-tile form of refactor")


def _shared(plan: Plan, tid: str) -> None:
    _tiled(plan, tid)
    if not plan.shared:
        raise InvalidPoint(f"{tid} needs the shared-memory tiles of tb-tiling")


def _once(flag: bool, message: str) -> None:
    if flag:
        raise InvalidPoint(message)


def refactor(plan: Plan, device: DeviceProfile) -> Change:
    _once(plan.tiled, "refactor: the kernel is already in block-tile form")
    return Change(Plan(hip=plan.hip, hlsl=plan.hlsl))


def tb_tiling(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "tb-tiling")
    _once(plan.shared, "tb-tiling: the operands already go through shared memory")
    return Change(plan.but(shared=True))


def thread_tiling(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "thread-tiling")
    _once(plan.thread_tile, "thread-tiling: threads already compute a tile each")
    _once(plan.mma, "thread-tiling: the tensor-core kernel has no SIMT thread tiles")
    _once(plan.warp_tile, "thread-tiling must come before warp-tiling (it changes the "
                          "thread grid warp-tiling was tied to)")
    child = plan.but(thread_tile=True)
    ties = ("BLOCK_M % TRD_Y_DIM == 0", "BLOCK_N % TRD_X_DIM == 0", _threads_limit(child, device))
    return Change(child, ties)


def thread_cache(plan: Plan, device: DeviceProfile) -> Change:
    if not plan.thread_tile:
        raise InvalidPoint("thread-cache needs the thread tiles of thread-tiling")
    _once(plan.thread_cache, "thread-cache: fragments are already cached in registers")
    return Change(plan.but(thread_cache=True))


def thread_chunk(plan: Plan, device: DeviceProfile) -> Change:
    if not plan.thread_tile:
        raise InvalidPoint("thread-chunk needs the thread tiles of thread-tiling")
    _once(plan.strided, "thread-chunk: a thread's outputs are already strided")
    return Change(plan.but(strided=True),
                  ("TRD_Y_DIM % THREAD_CHUNK == 0", "TRD_X_DIM % THREAD_CHUNK == 0"))


def warp_tiling(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "warp-tiling")
    _once(plan.warp_tile, "warp-tiling: lanes are already arranged per warp")
    _once(plan.mma, "warp-tiling: the tensor-core kernel arranges its warps itself")
    x = "(BLOCK_N // TRD_X_DIM)" if plan.thread_tile else "BLOCK_N"
    y = "(BLOCK_M // TRD_Y_DIM)" if plan.thread_tile else "BLOCK_M"
    if plan.hlsl:  # the backend defines PT_WAVE_SIZE as the device's subgroup size
        wave = device.wave_size
        if wave & (wave - 1) or not 4 <= wave <= 128:
            raise ApplyError(f"warp-tiling's reference implementation is for waves of a "
                             f"power of two from 4 to 128 lanes, device {device.name!r} "
                             f"has {wave}")
        return Change(plan.but(warp_tile=True), (
            f"WARP_X_DIM <= {wave}", f"{x} % WARP_X_DIM == 0",
            f"{y} % max(1, {wave} // WARP_X_DIM) == 0"))
    warp = _fact(device, "warp_size", 32)
    if warp not in ((32, 64) if plan.hip else (32,)):  # CUDA prints 32; HIP PT_WARP_SIZE
        raise ApplyError(f"warp-tiling's reference implementation is for warps of "
                         f"{'32 or 64' if plan.hip else '32'} lanes, device {device.name!r} "
                         f"has {warp}")
    ties = (f"{x} % WARP_X_DIM == 0", f"{y} % ({warp} // WARP_X_DIM) == 0")
    return Change(plan.but(warp_tile=True), ties)


def transpose(plan: Plan, device: DeviceProfile) -> Change:
    _shared(plan, "transpose")
    _once(plan.transpose_a, "transpose: the A tile is already stored transposed")
    return Change(plan.but(transpose_a=True))


def offset(plan: Plan, device: DeviceProfile) -> Change:
    _shared(plan, "offset")
    _once(plan.padded, "offset: the shared rows are already padded")
    return Change(plan.but(padded=True))


def vector_loads(plan: Plan, device: DeviceProfile) -> Change:
    """16-byte copies for each tile whose shared rows follow its global rows."""
    _shared(plan, "vector-loads")
    _once(plan.vector_a or plan.vector_b, "vector-loads: the tile copies are already vectorised")
    return Change(plan.but(vector_a=not plan.transpose_a, vector_b=True))


def register_staging(plan: Plan, device: DeviceProfile) -> Change:
    _shared(plan, "register-staging")
    _once(plan.staging, "register-staging: the copies are already staged in registers")
    _once(plan.stages, "register-staging: pipelining already overlaps the copies")
    return Change(plan.but(staging=True))


def double_buffer(plan: Plan, device: DeviceProfile) -> Change:
    """The staged tiles go to two shared buffers in turn: one barrier per K tile."""
    if not plan.staging:
        raise InvalidPoint("double-buffer needs the register-staged copies of register-staging")
    _once(plan.double_buffer, "double-buffer: the staged tiles already alternate")
    return Change(plan.but(double_buffer=True))


def interior_tiles(plan: Plan, device: DeviceProfile) -> Change:
    """Blocks wholly inside the matrices copy their tiles without bounds checks."""
    _shared(plan, "interior-tiles")
    _once(plan.interior, "interior-tiles: the interior blocks already copy unchecked")
    if plan.wgmma:
        raise InvalidPoint("interior-tiles: wgmma's copies are not the shared-tile copies it "
                           "changes (address-hoisting is their counterpart)")
    return Change(plan.but(interior=True))


def pipelining(plan: Plan, device: DeviceProfile) -> Change:
    _shared(plan, "pipelining")
    _once(plan.stages, "pipelining: the tiles are already multi-buffered")
    _once(plan.staging, "pipelining: register-staging already overlaps the copies")
    return Change(plan.but(stages=True))


def split_k(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "split-k")
    _once(plan.split_k, "split-k: K is already split")
    table = f"ceil_div(M, BLOCK_M) * ceil_div(N, BLOCK_N) <= {SPLIT_K_TABLE_SIZE}"
    return Change(plan.but(split_k=True), size_constraints=(table,))


def block_swizzle(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "block-swizzle")
    _once(plan.swizzle, "block-swizzle: the block order is already grouped")
    return Change(plan.but(swizzle=True))


def tensor_core(plan: Plan, device: DeviceProfile) -> Change:
    _shared(plan, "tensor-core")
    _once(plan.mma, "tensor-core: the kernel already uses tensor cores")
    _once(plan.thread_tile or plan.warp_tile,
          "tensor-core replaces the SIMT thread and warp tiles; apply it instead of them")
    ties = ("BLOCK_M % 16 == 0", "BLOCK_N % 8 == 0", "TILE_K_SIZE % 16 == 0")
    return Change(plan.but(mma=True), ties)


def tensor_tiling(plan: Plan, device: DeviceProfile) -> Change:
    if not plan.mma:
        raise InvalidPoint("tensor-tiling needs the MMA warp tiles of tensor-core")
    _once(plan.mma_tiles, "tensor-tiling: warps already own several MMA tiles")
    child = plan.but(mma_tiles=True)
    ties = ("BLOCK_M % (16 * TENSOR_TILE_M) == 0", "BLOCK_N % (8 * TENSOR_TILE_N) == 0",
            _threads_limit(child, device))
    return Change(child, ties)


def ldmatrix(plan: Plan, device: DeviceProfile) -> Change:
    if not plan.mma:
        raise InvalidPoint("ldmatrix needs the MMA fragments of tensor-core")
    _once(plan.ldmatrix, "ldmatrix: fragments are already loaded with ldmatrix")
    return Change(plan.but(ldmatrix=True))


def _wgmma_registers(plan: Plan, device: DeviceProfile) -> str:
    # each thread holds WGMMA_N / 2 accumulators (plus ~32 registers of addressing) for the
    # whole instruction: ptxas refuses a block whose threads cannot all get that many, and
    # with launch-bounds MIN_BLOCKS_PER_SM such blocks share the register file
    blocks = " * MIN_BLOCKS_PER_SM" if plan.launch_bounds else ""
    return (f"{threads_expression(plan)}{blocks} * (WGMMA_N // 2 + 32) <= "
            f"{_fact(device, 'registers_per_sm', 65536)}")


def wgmma(plan: Plan, device: DeviceProfile) -> Change:
    """Warpgroup MMAs from swizzled shared tiles: only on an sm_90a (Hopper) target."""
    if not plan.mma:
        raise InvalidPoint("wgmma needs the tensor-core kernel (fp16/bf16 tiles) of tensor-core")
    _once(plan.wgmma, "wgmma: the kernel already uses warpgroup MMAs")
    if not (plan.stages and plan.vector_a and plan.vector_b):
        raise InvalidPoint("wgmma needs the cp.async stages of pipelining and the 16-byte "
                           "copies of vector-loads (A stored [m][k])")
    _once(plan.mma_tiles or plan.ldmatrix, "wgmma replaces the mma.sync warp tiles and "
          "fragments of tensor-tiling and ldmatrix; apply it instead of them")
    _once(plan.transpose_a or plan.padded, "wgmma lays the tiles out in its own swizzled "
          "layout: it cannot follow transpose or offset")
    _once(plan.interior, "wgmma copies its tiles its own way: it cannot follow "
          "interior-tiles (address-hoisting is its counterpart)")
    arch = str(device.facts.get("arch", ""))
    if arch != "sm_90a":
        raise InvalidPoint(f"wgmma needs an sm_90a target (Hopper with arch = \"sm_90a\" in "
                           f"its profile); device {device.name!r} builds for {arch or '?'}")
    child = plan.but(wgmma=True)
    ties = ("BLOCK_M % 64 == 0", "BLOCK_N % WGMMA_N == 0", "TILE_K_SIZE % 64 == 0",
            _threads_limit(child, device), _wgmma_registers(child, device))
    return Change(child, ties)


def warp_specialize(plan: Plan, device: DeviceProfile) -> Change:
    """One more warpgroup that only copies; the wgmma warpgroups only compute."""
    if not plan.wgmma:
        raise InvalidPoint("warp-specialize needs the warpgroup kernel of wgmma")
    _once(plan.producer, "warp-specialize: a producer warpgroup already copies the tiles")
    child = plan.but(producer=True)
    # the producer runs NUM_STAGES - 1 tiles ahead of the MMAs, which hold one stage
    # until the next tile's MMAs are issued: fewer than 3 stages would serialise them
    ties = ("NUM_STAGES >= 3", _threads_limit(child, device), _wgmma_registers(child, device))
    return Change(child, ties)


def address_hoisting(plan: Plan, device: DeviceProfile) -> Change:
    """The warpgroup kernels' tile copies: inside tiles from per-thread bases."""
    if not plan.wgmma:
        raise InvalidPoint("address-hoisting needs the swizzled tile copies of wgmma")
    _once(plan.hoisted, "address-hoisting: the copy addresses are already worked out once")
    return Change(plan.but(hoisted=True))


def tma(plan: Plan, device: DeviceProfile) -> Change:
    """The warpgroup kernels' tiles loaded by TMA from the backend's tensor maps."""
    if not plan.wgmma:
        raise InvalidPoint("tma needs the swizzled stages of wgmma")
    _once(plan.tma, "tma: the tiles are already loaded by the Tensor Memory Accelerator")
    # a TMA box has at most 256 rows: BLOCK_M rows of A, TILE_K_SIZE rows of B
    return Change(plan.but(tma=True), ("BLOCK_M <= 256", "TILE_K_SIZE <= 256"))


def persistent(plan: Plan, device: DeviceProfile) -> Change:
    """One block per SM walks the output tiles; the producer's copies for the next tile
    run during the MMA warpgroups' epilogue of this one."""
    if not plan.producer:
        raise InvalidPoint("persistent needs the producer warpgroup of warp-specialize")
    _once(plan.persistent, "persistent: the blocks already walk the output tiles")
    _once(plan.split_k, "persistent walks whole output tiles: it cannot follow split-k")
    return Change(plan.but(persistent=True))


def register_budget(plan: Plan, device: DeviceProfile) -> Change:
    """setmaxnreg: the producer warpgroup keeps PRODUCER_REGS registers a thread, the MMA
    warpgroups take the rest of the SM's register file (one block per SM)."""
    if not plan.producer:
        raise InvalidPoint("register-budget needs the producer warpgroup of warp-specialize")
    _once(plan.budget, "register-budget: the warpgroups' registers are already set")
    _once(plan.launch_bounds, "register-budget sets the registers for one block per SM: it "
                              "cannot follow launch-bounds")
    if _fact(device, "registers_per_sm", 65536) != 65536:
        raise InvalidPoint(f"register-budget divides 65536 registers per SM; device "
                           f"{device.name!r} has {device.facts.get('registers_per_sm')}")
    child = plan.but(budget=True)
    return Change(child, (_producer_regs_fit(child),))


def _producer_regs_fit(plan: Plan) -> str:
    """register-budget: the producer's dec must not ask for more than a thread holds at
    entry (geometry's PT_ENTRY_REGS: 65536 over the block's threads, in 8s)."""
    return f"PRODUCER_REGS <= 65536 // ({threads_expression(plan)}) // 8 * 8"


def cluster_multicast(plan: Plan, device: DeviceProfile) -> Change:
    """Thread-block clusters of CLUSTER_M blocks down one column of C: each block's TMA
    issuer loads its share of their common B tile into every block (multicast)."""
    if not (plan.producer and plan.tma):
        raise InvalidPoint("cluster-multicast needs the TMA producer of warp-specialize and "
                           "tma")
    _once(plan.cluster, "cluster-multicast: the blocks already share their B tiles")
    _once(plan.stream_k, "cluster-multicast cannot follow stream-k: a cluster's blocks walk "
                         "whole tiles together")
    _once(plan.split_k, "cluster-multicast cannot follow split-k: the slices' hand-over "
                        "waits between blocks that a cluster holds resident")
    # a block's share of a B slab is whole 8-row swizzle atoms
    return Change(plan.but(cluster=True), ("TILE_K_SIZE % (8 * CLUSTER_M) == 0",))


def ping_pong(plan: Plan, device: DeviceProfile) -> Change:
    """Two groups of MMA warpgroups take a persistent block's output tiles in turn: one
    group's MMAs run while the other stores its tile."""
    if not plan.persistent:
        raise InvalidPoint("ping-pong needs the persistent blocks of persistent")
    _once(plan.pingpong, "ping-pong: two groups already take the output tiles in turn")
    _once(plan.stream_k, "ping-pong cannot follow stream-k: its units of work are the "
                         "block's, not a group's")
    child = plan.but(pingpong=True)
    # twice the MMA warpgroups: each must still hold its accumulators, and the producer's
    # budget is a share of fewer registers a thread
    ties = (_threads_limit(child, device), _wgmma_registers(child, device))
    return Change(child, (*ties, _producer_regs_fit(child)) if plan.budget else ties)


def stream_k(plan: Plan, device: DeviceProfile) -> Change:
    """The persistent grid's last partial wave of output tiles shared out as even runs of
    K tiles; blocks hand partial sums to the block that holds a tile's first K tile."""
    if not plan.persistent:
        raise InvalidPoint("stream-k needs the persistent blocks of persistent")
    _once(plan.stream_k, "stream-k: the last wave's K tiles are already shared out")
    _once(plan.pingpong, "stream-k shares K tiles between blocks, not between ping-pong's "
                         "groups: it cannot follow ping-pong")
    _once(plan.cluster, "stream-k cannot follow cluster-multicast: a cluster's blocks walk "
                        "whole tiles together")
    return Change(plan.but(stream_k=True))


def tma_store(plan: Plan, device: DeviceProfile) -> Change:
    """The MMA warpgroups store C through swizzled shared slabs with TMA."""
    if not (plan.producer and plan.tma):
        raise InvalidPoint("tma-store needs the TMA producer of warp-specialize and tma")
    _once(plan.tma_store, "tma-store: C is already stored by TMA")
    _once(plan.split_k, "tma-store cannot follow split-k: later slices add to C")
    return Change(plan.but(tma_store=True))


# CDNA targets with the 32 x 32 and 16 x 16 MFMA instructions (mfma_layout)
_MFMA_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942")


def mfma(plan: Plan, device: DeviceProfile) -> Change:
    """Waves of 64 lanes compute MFMA_TILE x MFMA_TILE tiles with MFMA: AMD CDNA GPUs only."""
    _shared(plan, "mfma")
    _once(plan.mfma, "mfma: the kernel already uses the matrix cores")
    if not plan.hip:
        raise InvalidPoint("mfma is AMD-only: it applies to HIP kernels (the seed naive.hip)")
    _once(plan.thread_tile or plan.warp_tile,
          "mfma replaces the SIMT thread and warp tiles; apply it instead of them")
    arch = str(device.facts.get("arch", "")).split(":")[0]
    if arch not in _MFMA_ARCHS:
        raise InvalidPoint(f"mfma needs an AMD GPU with matrix cores ({', '.join(_MFMA_ARCHS)}); "
                           f"device {device.name!r} builds for {arch or '?'}")
    if _fact(device, "warp_size", 64) != 64:
        raise ApplyError(f"mfma's lane layouts are for waves of 64 lanes, device "
                         f"{device.name!r} has {_fact(device, 'warp_size', 64)}")
    child = plan.but(mfma=True)
    # fp16's k per instruction (256 / MFMA_TILE: 8 or 16) also covers fp32's (2 or 4)
    ties = ("BLOCK_M % (MFMA_TILE * WAVES_M) == 0", "BLOCK_N % (MFMA_TILE * WAVES_N) == 0",
            "TILE_K_SIZE % (256 // MFMA_TILE) == 0", _threads_limit(child, device),
            _mfma_accumulators(device), _lds_limit(child, device))
    return Change(child, ties)


def cooperative_matrix(plan: Plan, device: DeviceProfile) -> Change:
    """Subgroups compute 16 x 16 tiles with Vulkan's cooperative matrices: HLSL only, on a
    device whose profile names them (facts.cooperative_matrix)."""
    _shared(plan, "cooperative-matrix")
    _once(plan.coopmat, "cooperative-matrix: the kernel already uses cooperative matrices")
    if not plan.hlsl:
        raise InvalidPoint("cooperative-matrix is Vulkan's: it applies to HLSL shaders")
    _once(plan.thread_tile or plan.warp_tile, "cooperative-matrix replaces the SIMT thread "
                                              "and warp tiles; apply it instead of them")
    shapes = str(device.facts.get("cooperative_matrix", ""))
    if "16x16x16" not in shapes:
        raise InvalidPoint(f"cooperative-matrix needs 16x16x16 fp16 cooperative matrices; "
                           f"device {device.name!r} names none (facts.cooperative_matrix)")
    child = plan.but(coopmat=True)
    wave = device.wave_size
    # each subgroup keeps PT_CM_M x PT_CM_N fp32 tiles of 16 x 16 (256 / wave per lane)
    tiles = "(BLOCK_M // (16 * WAVES_M)) * (BLOCK_N // (16 * WAVES_N))"
    ties = ("BLOCK_M % (16 * WAVES_M) == 0", "BLOCK_N % (16 * WAVES_N) == 0",
            "TILE_K_SIZE % 16 == 0",
            f"{wave} * WAVES_M * WAVES_N <= {_fact(device, 'max_threads_per_group', 1024)}",
            f"{tiles} * {256 // wave} <= 128")
    return Change(child, ties)


def direct_store(plan: Plan, device: DeviceProfile) -> Change:
    """The cooperative-matrix tiles stored straight to C: no groupshared slot, no bounds,
    so only sizes of whole block tiles with rows of whole 16-byte pieces (declared as the
    variant's size constraints; other sizes are refused, not run)."""
    _once(plan.direct_store, "direct-store: the tiles already go straight to C")
    if not plan.coopmat:
        raise InvalidPoint("direct-store stores cooperative-matrix tiles: apply "
                           "cooperative-matrix first")
    return Change(plan.but(direct_store=True),
                  size_constraints=("M % BLOCK_M == 0", "N % BLOCK_N == 0", "N % 8 == 0"))


def workgroup_matrix(plan: Plan, device: DeviceProfile) -> Change:
    """The thread group's one BLOCK_M x BLOCK_N cooperative matrix, its tiles loaded from
    the buffers and stored to C through tensor layouts that clamp at the matrices' edges
    (any size): HLSL only, on a device whose profile names VK_NV_cooperative_matrix2's
    workgroup scope (facts.workgroup_matrix)."""
    _once(plan.workgroup_matrix, "workgroup-matrix: the group already holds one matrix")
    if not plan.coopmat:
        raise InvalidPoint("workgroup-matrix replaces the subgroups' cooperative matrices: "
                           "apply cooperative-matrix first")
    _once(plan.direct_store, "workgroup-matrix stores the group's tile through a tensor "
                             "layout, for any size: direct-store's whole-tile store would be "
                             "left unused")
    for part, step in (("vector_b", "vector-loads"), ("staging", "register-staging"),
                       ("interior", "interior-tiles")):
        _once(getattr(plan, part), f"workgroup-matrix loads its tiles from the buffers: "
                                   f"{step}'s groupshared copies would be left unused")
    if not device.facts.get("workgroup_matrix"):
        raise InvalidPoint(f"workgroup-matrix needs cooperative matrices of a whole thread "
                           f"group (VK_NV_cooperative_matrix2); device {device.name!r} names "
                           "none (facts.workgroup_matrix)")
    # the driver's workgroup-scope shapes (VkCooperativeMatrixFlexibleDimensionsProperties
    # NV; NVIDIA's, read with benchmarks/vulkan_features.py): groups of 32, 64, 128 or 256
    # threads (WAVES_M and WAVES_N are powers of 2), M a multiple of 32 from 128 threads,
    # N too at 256
    threads = f"{device.wave_size} * WAVES_M * WAVES_N"
    limit = _fact(device, "workgroup_matrix_max_threads", 256)
    ties = (f"{threads} <= {limit}", f"{threads} < 128 or BLOCK_M % 32 == 0",
            f"{threads} < 256 or BLOCK_N % 32 == 0")
    return Change(plan.but(workgroup_matrix=True), ties)


def wave_broadcast(plan: Plan, device: DeviceProfile) -> Change:
    """Each lane reads a share of the thread-cache fragments its wave patch's row (A) or
    column (B) needs, and gets the rest from the lanes that read them (WaveReadLaneAt):
    HLSL only, where the backend sets the subgroup size (PT_WAVE_SIZE)."""
    _shared(plan, "wave-broadcast")
    _once(plan.wave_broadcast, "wave-broadcast: the fragments are already shared in the wave")
    if not plan.hlsl:
        raise InvalidPoint("wave-broadcast is HLSL's (WaveReadLaneAt): it applies to HLSL "
                           "shaders")
    if not (plan.thread_cache and plan.warp_tile):
        raise InvalidPoint("wave-broadcast needs the register fragments of thread-cache and "
                           "the wave patches of warp-tiling")
    # a patch row of WARP_X_DIM lanes splits the TRD_Y_DIM values of A evenly, a patch
    # column of wave / WARP_X_DIM lanes the TRD_X_DIM values of B (warp-tiling already
    # keeps WARP_X_DIM <= wave)
    rows = f"max(1, {device.wave_size} // WARP_X_DIM)"
    return Change(plan.but(wave_broadcast=True),
                  ("TRD_Y_DIM % WARP_X_DIM == 0", f"TRD_X_DIM % {rows} == 0"))


def _mfma_accumulators(device: DeviceProfile) -> str:
    # MFMA_TILE^2 / 64 fp32 accumulators per lane per tile (16 or 4), held for the whole
    # K loop: more than the AGPRs (on gfx90a and gfx942 at most half the unified
    # 512-register file) cannot fit beside the operands and addresses in the VGPRs
    tiles = "(BLOCK_M // (MFMA_TILE * WAVES_M)) * (BLOCK_N // (MFMA_TILE * WAVES_N))"
    return f"MFMA_TILE * MFMA_TILE // 64 * {tiles} <= {_fact(device, 'max_agprs', 256)}"


def _lds_limit(plan: Plan, device: DeviceProfile) -> str:
    # the tiles as the launch counts them (4-byte elements); later steps (offset,
    # double-buffer) only add to them, and the backend checks the final size
    kib = _fact(device, "shared_memory_per_block_kib", 64)
    return f"{smem_elements(plan)} * {smem_unit(plan)} <= {kib * 1024}"


def launch_bounds(plan: Plan, device: DeviceProfile) -> Change:
    _tiled(plan, "launch-bounds")
    _once(plan.launch_bounds, "launch-bounds: the kernel already declares its launch bounds")
    child = plan.but(launch_bounds=True)
    return Change(child, (_wgmma_registers(child, device),) if plan.wgmma else ())


RULES: Mapping[str, Rule] = {
    "refactor": refactor,
    "tb-tiling": tb_tiling,
    "thread-tiling": thread_tiling,
    "thread-cache": thread_cache,
    "thread-chunk": thread_chunk,
    "warp-tiling": warp_tiling,
    "transpose": transpose,
    "offset": offset,
    "register-staging": register_staging,
    "double-buffer": double_buffer,
    "interior-tiles": interior_tiles,
    "pipelining": pipelining,
    "split-k": split_k,
    "block-swizzle": block_swizzle,
    "tensor-core": tensor_core,
    "tensor-tiling": tensor_tiling,
    "vector-loads": vector_loads,
    "launch-bounds": launch_bounds,
    "ldmatrix": ldmatrix,
    "wgmma": wgmma,
    "warp-specialize": warp_specialize,
    "address-hoisting": address_hoisting,
    "tma": tma,
    "persistent": persistent,
    "register-budget": register_budget,
    "cluster-multicast": cluster_multicast,
    "tma-store": tma_store,
    "ping-pong": ping_pong,
    "stream-k": stream_k,
    "mfma": mfma,
    "cooperative-matrix": cooperative_matrix,
    "wave-broadcast": wave_broadcast,
    "direct-store": direct_store,
    "workgroup-matrix": workgroup_matrix,
}
