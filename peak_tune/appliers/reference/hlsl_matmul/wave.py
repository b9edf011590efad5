"""The wave-broadcast step: the thread-cache fragments shared between a wave's lanes.

After warp-tiling, a wave's PT_WAVE_SIZE lanes cover a PT_PATCH_ROWS x WARP_X_DIM patch
of the thread grid: lane `lane` sits in patch row `lane_y = lane / WARP_X_DIM` and patch
column `lane_x = lane % WARP_X_DIM`. The WARP_X_DIM lanes of a patch row have the same ty,
so they need the same A fragment a[PT_TRD_Y]; the PT_PATCH_ROWS lanes of a patch column
have the same tx and need the same b[PT_TRD_X]. Each lane reads from the groupshared tiles
only its share (a[i] for i % WARP_X_DIM == lane_x, b[j] for j % PT_PATCH_ROWS == lane_y)
and takes the others from the lanes that read them:

    a[i] = WaveReadLaneAt(a_own[i / WARP_X_DIM], lane_y * WARP_X_DIM + i % WARP_X_DIM)
    b[j] = WaveReadLaneAt(b_own[j / PT_PATCH_ROWS], j % PT_PATCH_ROWS * WARP_X_DIM + lane_x)

The lane index differs from lane to lane (it depends on lane_y or lane_x): DXC and
glslang's HLSL front end both print such a WaveReadLaneAt as OpGroupNonUniformShuffle
(a lane index per lane, SPIR-V 1.3), where a constant index would be
OpGroupNonUniformBroadcast. Every lane of the wave reaches each call (the compute has no
branches that depend on the lane), as shuffles need.
"""

from __future__ import annotations

from peak_tune.appliers.reference.cuda_matmul.plan import Plan

from .writer import HlslWriter

__all__ = ["emit_wave_compute_tile", "emit_wave_lanes", "wave_macros"]


def wave_macros() -> str:
    """The shares of the fragments and the #if checks of the step's ties."""
    return ("#define PT_PATCH_ROWS (PT_WAVE_SIZE / WARP_X_DIM) /* a wave patch's rows */\n"
            "#define PT_A_SHARE (PT_TRD_Y / WARP_X_DIM) /* A values a lane reads per k */\n"
            "#define PT_B_SHARE (PT_TRD_X / PT_PATCH_ROWS) /* B values a lane reads per k */\n"
            "#if PT_TRD_Y % WARP_X_DIM != 0 || PT_TRD_X % PT_PATCH_ROWS != 0\n"
            '#error "wave-broadcast: a patch row must split a[] evenly, a patch column b[]"\n'
            "#endif")


def emit_wave_lanes(writer: HlslWriter, plan: Plan) -> None:
    """The lane's place in its wave patch (after warp-tiling's lane)."""
    if plan.wave_broadcast:
        writer.line("const int lane_x = lane % WARP_X_DIM, lane_y = lane / WARP_X_DIM; "
                    "// wave-broadcast: the lane's patch column and row")


def emit_wave_compute_tile(writer: HlslWriter, a_tile: str, b_tile: str) -> None:
    """One groupshared K tile: per k, the lane's shares of a[] and b[], the rest from the
    lanes of its patch row and column, then the outer product."""
    with writer.unrolled("kk", "PT_TK"):
        writer.lines("// wave-broadcast: this lane reads its share of the fragments; the",
                     "// lanes of its patch row (A) and column (B) read the rest.",
                     "ACC a_own[PT_A_SHARE], b_own[PT_B_SHARE];")
        with writer.unrolled("s", "PT_A_SHARE"):
            writer.line(f"a_own[s] = (ACC)PT_AS({a_tile}, PT_ROW(s * WARP_X_DIM + lane_x), kk);")
        with writer.unrolled("s", "PT_B_SHARE"):
            writer.line(f"b_own[s] = (ACC)PT_BS({b_tile}, kk, "
                        "PT_COL(s * PT_PATCH_ROWS + lane_y));")
        writer.line("ACC a[PT_TRD_Y], b[PT_TRD_X]; // thread-cache: fragments in registers")
        with writer.unrolled("i", "PT_TRD_Y"):
            writer.line("a[i] = WaveReadLaneAt(a_own[i / WARP_X_DIM], "
                        "lane_y * WARP_X_DIM + i % WARP_X_DIM);")
        with writer.unrolled("j", "PT_TRD_X"):
            writer.line("b[j] = WaveReadLaneAt(b_own[j / PT_PATCH_ROWS], "
                        "j % PT_PATCH_ROWS * WARP_X_DIM + lane_x);")
        with writer.unrolled("i", "PT_TRD_Y"), writer.unrolled("j", "PT_TRD_X"):
            writer.line("acc[i][j] += a[i] * b[j];")
