"""Sizes that follow from a plan: tuning macros used, derived PT_* macros, launch geometry.

The same quantities are written twice, once as C macros for the kernel and once as
peak_tune.expr expressions for KernelContext.launch; both come from the tables here so
they cannot drift apart. Shared memory is static when the tiles fit in 48 KiB (less a
little, STATIC_SHARED_LIMIT) and dynamic (extern __shared__, launch shared_bytes) above
that (always dynamic for wgmma, WGMMA_ALIGN bytes larger). Launch expressions cannot see
the element type, so the size is counted in 4-byte elements on the SIMT and MFMA paths
(the kernel static_asserts that DTYPE is no wider when it uses dynamic memory) and 2-byte
ones on the tensor-core path (fp16/bf16 only).
"""

from __future__ import annotations

from .plan import Plan

__all__ = ["BARRIER_BYTES", "CLUSTER_B_BOX", "C_SLABS_BYTES", "ORDER_BYTES",
           "STATIC_SHARED_LIMIT", "TMA_BOXES", "TMA_C_BOX", "WGMMA_ALIGN", "barrier_bytes",
           "derived_macros", "has_barriers", "launch_of", "macros_used", "mma_warpgroups",
           "smem_elements", "smem_unit", "threads_expression"]

# Tiles up to this many bytes are static shared memory: 48 KiB, the most a block may
# declare statically, less 64 bytes kept for the kernel's other __shared__ variables.
STATIC_SHARED_LIMIT = 49152 - 64
# The wgmma kernel's stages start on this boundary (the 128-byte swizzle's period): its
# dynamic shared memory is launched this much larger.
WGMMA_ALIGN = 1024
# warp-specialize, tma: two 8-byte mbarriers per stage (tile full, stage empty) after the
# stages
BARRIER_BYTES = 16
# ping-pong: one 8-byte mbarrier per group of MMA warpgroups, after the stages' barriers
ORDER_BYTES = 16
# tma: the box of one TMA copy is a 64-element (128-byte) slab of a tile row, swizzled like
# the tiles; A's box is BLOCK_M rows of its K slab, B's TILE_K_SIZE rows of its N slab
TMA_BOXES = {"tma_A": "BLOCK_M, 64, 128", "tma_B": "TILE_K_SIZE, 64, 128"}
# cluster-multicast: each of the CLUSTER_M blocks loads TILE_K_SIZE / CLUSTER_M rows of the
# B slab for all of them
CLUSTER_B_BOX = "TILE_K_SIZE // CLUSTER_M, 64, 128"
# tma-store: C leaves in boxes of 64 x 64 elements from swizzled slabs; an MMA
# warpgroup's two slabs take C_SLABS_BYTES (fp16/bf16)
TMA_C_BOX = "64, 64, 128"
C_SLABS_BYTES = 2 * 64 * 64 * 2


def mma_warpgroups(plan: Plan) -> str:
    """The macro counting a warp-specialized kernel's MMA warpgroups: PT_CONSUMERS, one
    group of them, or with ping-pong two groups (PT_MMA_WGS)."""
    return "PT_MMA_WGS" if plan.pingpong else "PT_CONSUMERS"


def barrier_bytes(plan: Plan, stages: str) -> str:
    """The mbarriers' bytes after the stages (and slabs), as a C or launch expression:
    full and empty per stage, and ping-pong's two order barriers."""
    order = f" + {ORDER_BYTES}" if plan.pingpong else ""
    return f"{BARRIER_BYTES} * {stages}{order}"


def has_barriers(plan: Plan) -> bool:
    """Whether the wgmma kernel keeps mbarriers after its stages."""
    return plan.producer or plan.tma


def macros_used(plan: Plan) -> tuple[str, ...]:
    """The tuning parameters the printed code needs, in a fixed order."""
    used = ["BLOCK_M", "BLOCK_N"]
    if plan.shared:
        used.append("TILE_K_SIZE")
    if plan.thread_tile:
        used += ["TRD_Y_DIM", "TRD_X_DIM"]
    if plan.strided:
        used.append("THREAD_CHUNK")
    if plan.warp_tile:
        used.append("WARP_X_DIM")
    if plan.padded:
        used.append("OFFSET_AMOUNT")
    if plan.stages:
        used.append("NUM_STAGES")
    if plan.split_k:
        used.append("K_SPLITS")
    if plan.swizzle:
        used.append("SWIZZLE_GROUP")
    if plan.mma_tiles:
        used += ["TENSOR_TILE_M", "TENSOR_TILE_N"]
    if plan.launch_bounds:
        used.append("MIN_BLOCKS_PER_SM")
    if plan.wgmma:
        used.append("WGMMA_N")
    if plan.budget:
        used.append("PRODUCER_REGS")
    if plan.cluster:
        used.append("CLUSTER_M")
    if plan.stream_k:
        used.append("SK_DOWNWARDS")
    if plan.mfma or plan.coopmat:
        used += ["WAVES_M", "WAVES_N"]
    if plan.mfma:
        used.append("MFMA_TILE")
    return tuple(used)


def smem_unit(plan: Plan) -> int:
    """Bytes per shared element assumed by the launch (see the module docstring)."""
    return 2 if plan.mma else 4


def _or(plan_has: bool, macro: str, default: str) -> str:
    return macro if plan_has else default


def derived_macros(plan: Plan) -> list[str]:
    """#define lines for the PT_* quantities the kernel is written in."""
    lines = ["#define PT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))",
             "#define PT_ROUND8(x) (PT_CEIL_DIV(x, 8) * 8)"]
    if plan.producer:
        mma = mma_warpgroups(plan)
        lines += ["#define PT_CONSUMERS ((BLOCK_M / 64) * (BLOCK_N / WGMMA_N)) "
                  "/* warpgroups of 64 x WGMMA_N that compute */"]
        if plan.pingpong:
            lines.append(f"#define {mma} (2 * PT_CONSUMERS) /* ping-pong: two groups of them, "
                         "the block's output tiles in turn */")
        lines += [f"#define PT_THREADS (128 * ({mma} + 1)) /* ... and one that copies */",
                  "#define PT_LOADERS 128 /* threads that copy the tiles */"]
        if plan.tma_store:
            lines.append(f"#define PT_C_SLABS ({mma} * 2 * 64 * 64) "
                         "/* tma-store: two 64 x 64 slabs of C per MMA warpgroup */")
        if plan.budget:
            # ptxas gives a kernel that uses setmaxnreg its launch bounds' most registers
            # (168 at 384 threads, 96 at 640), and setmaxnreg.inc waits for registers
            # that the block's own dec freed: the budget divides what the block holds
            lines += [
                "#define PT_ENTRY_REGS (65536 / PT_THREADS / 8 * 8 < 256 ? "
                "65536 / PT_THREADS / 8 * 8 : 256) /* register-budget: a thread's at entry */",
                f"#define PT_MMA_FIT ((PT_ENTRY_REGS * ({mma} + 1) - PRODUCER_REGS) "
                f"/ {mma} / 8 * 8) /* what the producer leaves the MMA warpgroups */",
                "#define PT_MMA_REGS (PT_MMA_FIT < 256 ? PT_MMA_FIT : 256)"]
    elif plan.wgmma:
        lines += ["#define PT_THREADS (128 * (BLOCK_M / 64) * (BLOCK_N / WGMMA_N)) "
                  "/* wgmma: warpgroups of 64 x WGMMA_N */"]
    elif plan.mfma:
        lines += [
            "#define PT_WAVE_M (BLOCK_M / WAVES_M) /* a wave's tile rows: PT_MFMA_M MFMA tiles */",
            "#define PT_WAVE_N (BLOCK_N / WAVES_N) /* a wave's tile columns: PT_MFMA_N tiles */",
            "#define PT_MFMA_M (PT_WAVE_M / MFMA_TILE) /* MFMA tiles per wave along M */",
            "#define PT_MFMA_N (PT_WAVE_N / MFMA_TILE)",
            "#define PT_THREADS (64 * WAVES_M * WAVES_N) /* waves of 64 lanes */",
        ]
    elif plan.coopmat:
        lines += [
            "#define PT_SUB_M (BLOCK_M / WAVES_M) /* a subgroup's tile rows: PT_CM_M tiles */",
            "#define PT_SUB_N (BLOCK_N / WAVES_N) /* a subgroup's tile columns: PT_CM_N */",
            "#define PT_CM_M (PT_SUB_M / 16) /* 16 x 16 cooperative-matrix tiles along M */",
            "#define PT_CM_N (PT_SUB_N / 16)",
            "#define PT_THREADS_X (PT_WAVE_SIZE * WAVES_M * WAVES_N) /* subgroups of lanes */",
            "#define PT_THREADS_Y 1",
            "#define PT_THREADS (PT_THREADS_X * PT_THREADS_Y)",
        ]
    elif plan.mma:
        lines += [
            f"#define PT_MMA_M {_or(plan.mma_tiles, 'TENSOR_TILE_M', '1')}",
            f"#define PT_MMA_N {_or(plan.mma_tiles, 'TENSOR_TILE_N', '1')}",
            "#define PT_WARP_M (16 * PT_MMA_M) /* warp tile rows: PT_MMA_M m16 tiles */",
            "#define PT_WARP_N (8 * PT_MMA_N) /* warp tile columns: PT_MMA_N n8 tiles */",
            "#define PT_WARPS_M (BLOCK_M / PT_WARP_M)",
            "#define PT_WARPS_N (BLOCK_N / PT_WARP_N)",
            "#define PT_THREADS (32 * PT_WARPS_M * PT_WARPS_N)",
        ]
    else:
        lines += [
            f"#define PT_TRD_Y {_or(plan.thread_tile, 'TRD_Y_DIM', '1')}",
            f"#define PT_TRD_X {_or(plan.thread_tile, 'TRD_X_DIM', '1')}",
            "#define PT_THREADS_X (BLOCK_N / PT_TRD_X) /* the thread grid: blockDim.x */",
            "#define PT_THREADS_Y (BLOCK_M / PT_TRD_Y) /* blockDim.y */",
            "#define PT_THREADS (PT_THREADS_X * PT_THREADS_Y)",
        ]
    if plan.shared:
        lda = "(BLOCK_M + PT_PAD)" if plan.transpose_a else "(PT_TK + PT_PAD)"
        rows = "PT_TK" if plan.transpose_a else "BLOCK_M"
        lines += [
            "#define PT_TK TILE_K_SIZE",
            f"#define PT_PAD {_pad(plan)}",
            f"#define PT_LDA {lda} /* row stride of the A tile, "
            f"{'[k][m]' if plan.transpose_a else '[m][k]'} */",
            f"#define PT_A_TILE PT_ROUND8({rows} * PT_LDA)",
            "#define PT_LDB (BLOCK_N + PT_PAD) /* row stride of the B tile, [k][n] */",
            "#define PT_B_TILE PT_ROUND8(PT_TK * PT_LDB)",
            f"#define PT_STAGES {_buffers(plan)}",
            f"#define PT_SMEM_ELEMS {_smem_elems(plan)}",
            f"#define PT_SMEM_EST_BYTES (PT_SMEM_ELEMS * {smem_unit(plan)})",
        ]
    lines.append(f"#define PT_KSTEP {_or(plan.shared, 'PT_TK', '1')}")
    return lines


def _smem_elems(plan: Plan) -> str:
    """The kernel's shared elements: the stages, and tma-store's C slabs after them."""
    if plan.tma_store:
        return ("(PT_STAGES * (PT_A_TILE + PT_B_TILE) + PT_C_SLABS) /* tma-store: C slabs "
                "after the stages */")
    return "(PT_STAGES * (PT_A_TILE + PT_B_TILE))"


def _pad(plan: Plan) -> str:
    """Elements that pad each shared row: OFFSET_AMOUNT (offset), 8 for cooperative
    matrices (16 bytes of halves: their rows stay 16-byte aligned, as the driver's
    matrix loads want, and start in different banks), else 0."""
    if plan.coopmat:
        return "8 /* cooperative-matrix: 16 bytes */"
    return _or(plan.padded, "OFFSET_AMOUNT", "0")


def _buffers(plan: Plan) -> str:
    """Shared buffers of the tiles, as a macro or expression: NUM_STAGES (pipelining),
    2 (double-buffer) or 1."""
    return "NUM_STAGES" if plan.stages else "2" if plan.double_buffer else "1"


def threads_expression(plan: Plan) -> str:
    """Threads per block as a launch/constraint expression."""
    if plan.producer:
        return f"128 * ({_groups(plan)}(BLOCK_M // 64) * (BLOCK_N // WGMMA_N) + 1)"
    if plan.wgmma:
        return "128 * (BLOCK_M // 64) * (BLOCK_N // WGMMA_N)"
    if plan.mfma:
        return "64 * WAVES_M * WAVES_N"
    if plan.coopmat:
        return "PT_WAVE_SIZE * WAVES_M * WAVES_N"
    if plan.mma:
        m = "(16 * TENSOR_TILE_M)" if plan.mma_tiles else "16"
        n = "(8 * TENSOR_TILE_N)" if plan.mma_tiles else "8"
        return f"32 * (BLOCK_M // {m}) * (BLOCK_N // {n})"
    return f"({_block_y(plan)}) * ({_block_x(plan)})"


def _groups(plan: Plan) -> str:
    """ping-pong's two groups of MMA warpgroups, as a factor of a launch expression."""
    return "2 * " if plan.pingpong else ""


def _block_x(plan: Plan) -> str:
    return "BLOCK_N // TRD_X_DIM" if plan.thread_tile else "BLOCK_N"


def _block_y(plan: Plan) -> str:
    return "BLOCK_M // TRD_Y_DIM" if plan.thread_tile else "BLOCK_M"


def smem_elements(plan: Plan) -> str:
    """Shared-memory elements of the tiles (all buffers), as a launch expression."""
    pad = " + OFFSET_AMOUNT" if plan.padded else ""
    if plan.transpose_a:
        a_tile = f"TILE_K_SIZE * (BLOCK_M{pad})"
    else:
        a_tile = f"BLOCK_M * (TILE_K_SIZE{pad})"
    b_tile = f"TILE_K_SIZE * (BLOCK_N{pad})"
    tiles = f"ceil_div({a_tile}, 8) * 8 + ceil_div({b_tile}, 8) * 8"
    buffers = _buffers(plan)
    return f"({tiles})" if buffers == "1" else f"{buffers} * ({tiles})"


def launch_of(plan: Plan) -> dict[str, str]:
    """KernelContext.launch for the plan (peak_tune.backends._cuda_launch keys)."""
    launch = {"grid_x": "ceil_div(N, BLOCK_N)", "grid_y": "ceil_div(M, BLOCK_M)"}
    if plan.cluster:  # CLUSTER_M blocks along x compute CLUSTER_M block rows of a column
        launch = {"grid_x": "ceil_div(N, BLOCK_N) * CLUSTER_M",
                  "grid_y": "ceil_div(ceil_div(M, BLOCK_M), CLUSTER_M)"}
    if plan.persistent:  # one block per SM (SMS: the running device's), none idle
        launch = {"grid_x": "min(ceil_div(M, BLOCK_M) * ceil_div(N, BLOCK_N), SMS)"}
        if plan.cluster:  # whole clusters, walking the tiles of CLUSTER_M block rows
            launch = {"grid_x": "min(ceil_div(ceil_div(M, BLOCK_M), CLUSTER_M) * "
                                "ceil_div(N, BLOCK_N), SMS // CLUSTER_M) * CLUSTER_M"}
    if plan.split_k:
        launch["grid_z"] = "K_SPLITS"
    if plan.mma or plan.mfma:  # a one-dimensional block of warps / waves
        launch["block_x"] = threads_expression(plan)
    else:
        launch["block_x"] = _block_x(plan)
        launch["block_y"] = _block_y(plan)
    if plan.wgmma:  # always dynamic, WGMMA_ALIGN more to align the stages
        barriers = f" + {barrier_bytes(plan, 'NUM_STAGES')}" if has_barriers(plan) else ""
        slabs = (f" + {_groups(plan)}(BLOCK_M // 64) * (BLOCK_N // WGMMA_N) * {C_SLABS_BYTES}"
                 if plan.tma_store else "")
        launch["shared_bytes"] = f"{smem_elements(plan)} * 2 + {WGMMA_ALIGN}{barriers}{slabs}"
        if plan.tma:
            launch.update(TMA_BOXES)
            if plan.cluster:
                launch["tma_B"] = CLUSTER_B_BOX
            if plan.tma_store:
                launch["tma_C"] = TMA_C_BOX
    elif plan.shared:
        size = f"{smem_elements(plan)} * {smem_unit(plan)}"
        launch["shared_bytes"] = f"({size} > {STATIC_SHARED_LIMIT}) * {size}"
    else:
        launch["shared_bytes"] = "0"
    return launch
