"""The Hopper warpgroup kernel (`wgmma`): cp.async into 128-byte-swizzled shared tiles,
wgmma.mma_async reading both operands through matrix descriptors, fp32 accumulators in
registers mapped back to C in the epilogue.

Layout (elements are 2 bytes, a 16-byte chunk is 8 elements, a swizzle atom is 8 rows of
128 bytes = 1024 bytes):

- A tile, K-major: [PT_TK / 64][BLOCK_M][64]; element (m, k) of the tile lies at
  (k / 64) * BLOCK_M * 64 + m * 64 + ((k % 64 / 8) ^ (m % 8)) * 8 + k % 8.
- B tile, N-major (B is K x N row-major): [BLOCK_N / 64][PT_TK][64]; element (k, n) at
  (n / 64) * PT_TK * 64 + k * 64 + ((n % 64 / 8) ^ (k % 8)) * 8 + n % 8.

Each stage starts 1024-byte aligned, so the XOR above is the hardware's 128-byte swizzle.
Warpgroup g (128 threads) owns the 64 x WGMMA_N tile at (wm, wn) of the block tile.

With warp-specialize (plan.producer) one more warpgroup only copies: mbarriers after the
stages say when a stage is full (the producer's cp.async copies landed) and when it is
empty again (the MMAs that read it are done), instead of two __syncthreads per K tile.
On the H200 it measured slower than the plain kernel (2026-11-30-h200-wgmma-2.json):
one warpgroup issuing 16-byte cp.async copies cannot keep up; TMA would.

With persistent (plan.persistent, after warp-specialize) the grid has one block per SM
and each block computes output tiles blockIdx.x, + gridDim.x, ... in turn; `it` counts
the K tiles of all of them, which go through the stages in turn (K tile `it` in stage
it % PT_STAGES, phase it / PT_STAGES of its barriers), so the producer fills the next
output tile's stages while the MMA warpgroups store this one.

With ping-pong (plan.pingpong, after persistent) the MMA warpgroups form two groups
that take the block's output tiles in turn; an order mbarrier per group (after the
stages' barriers) lets a group wait on its stages only once the other has issued its
tile's MMAs, since a parity wait names a phase only within one round of the stages. On an
H100 it validated but ran 0.84x against the one-group kernel's 0.97x
(2026-12-06-h100-ping-pong-triton-bf16.json).

With stream-k (plan.stream_k, after persistent) every role walks the block's units of
work instead (pt_sk_unit: whole tiles of the full waves, then the block's even run of
the last partial wave's K tiles, a piece per output tile), each over its K tiles
[kb, ke); a piece without the tile's first K tile leaves its sums in the block's
workspace slot (pt_sk_save), the holder of the first K tile adds them (pt_sk_gather)
before its epilogue.

With address-hoisting (plan.hoisted) a tile wholly inside its matrix is copied from each
thread's first chunk of it, one add per further chunk (pt_wg_copy_inside), instead of
the checked copy's index arithmetic per chunk; edge tiles keep the checked copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .emit_compute import emit_split_k_release, emit_split_k_wait
from .emit_wgmma_text import (
    BUDGET,
    CLUSTER,
    MBARRIER,
    PREAMBLE,
    PRODUCER,
    STREAM_K,
    TMA,
    TMA_STORE,
    WG_SYNC,
    WGMMA_SHAPES,
    wgmma_function,
)
from .geometry import WGMMA_ALIGN as _ALIGN
from .geometry import barrier_bytes, has_barriers, mma_warpgroups
from .plan import Plan
from .writer import CodeWriter

__all__ = ["WGMMA_SHAPES", "emit_wgmma_helpers", "emit_wgmma_kernel"]

def _copiers(plan: Plan) -> str:
    """The macro counting the threads that copy the tiles: the producer's, or all."""
    return "PT_LOADERS" if plan.producer else "PT_THREADS"


def _copy_function(writer: CodeWriter, name: str, plan: Plan) -> None:
    """pt_wg_copy_a / _b: one operand tile into a swizzled stage with cp.async, shared
    out among the block's threads, or the producer's (tid counted from 0). The producer
    unrolls by 4 only: fully unrolled, its hoisted addresses outgrow the registers that
    the MMA warpgroups' launch bounds leave it (ptxas spills). With tma they copy only
    where the backend could not map A or B, and stay rolled: unrolled, this fallback was
    a third of the kernel's NVRTC time."""
    copiers = _copiers(plan)
    if name == "a":
        rows, chunks = "BLOCK_M", "(PT_TK / 8)"
        where = "int row_hi, int col_hi"
        comment = "A tile (BLOCK_M x PT_TK at (bm, k0)): rows < M, columns < k_hi"
    else:
        rows, chunks = "PT_TK", "(BLOCK_N / 8)"
        where = "int row_hi, int col_hi"
        comment = "B tile (PT_TK x BLOCK_N at (k0, bn)): rows < k_hi, columns < N"
    writer.line(f"// The {comment}; zeros outside. 16-byte cp.async where a")
    writer.line("// chunk lies wholly inside (and vec) or wholly outside; elements otherwise.")
    if plan.producer:
        writer.line("// True when some chunk was stored plainly (not by cp.async).")
    kind = "bool" if plan.producer else "void"
    head = (f"__device__ __forceinline__ {kind} pt_wg_copy_{name}(DTYPE *__restrict__ s, "
            "const DTYPE *__restrict__ g, int ld, int row0, int col0, "
            f"{where}, int tid, bool vec)")
    units = f"{rows} * {chunks}"
    with writer.block(head):
        if plan.producer:
            writer.line("bool plain = false;")
        with writer.unrolled("it", f"PT_CEIL_DIV({units}, {copiers})",
                             factor=1 if plan.tma else 4 if plan.producer else 0):
            writer.line(f"const int u = tid + it * {copiers};")
            with writer.block(f"if (({units}) % {copiers} == 0 || u < {units})"):
                writer.lines(
                    f"const int r = u / {chunks}, ch = u % {chunks};",
                    "const int row = row0 + r, col = col0 + ch * 8;",
                    f"DTYPE *const dst = s + pt_swz({rows}, r, ch);",
                    "const bool row_in = row < row_hi;",
                    "const bool full = row_in && col + 8 <= col_hi;",
                    "const size_t off = (size_t)row * ld + col;")
                with writer.block("if ((vec && full) || !row_in || col >= col_hi)"):
                    writer.line("pt_cp_async<16>(dst, full ? g + off : g, full);")
                with writer.block("else"):
                    writer.lines("DTYPE t[8];", "#pragma unroll",
                                 "for (int q = 0; q < 8; ++q) "
                                 "t[q] = row_in && col + q < col_hi ? g[off + q] : PT_ZERO;",
                                 "uint4 v;", "memcpy(&v, t, 16);",
                                 "*reinterpret_cast<uint4 *>(dst) = v;")
                    if plan.producer:
                        writer.line("plain = true;")
        if plan.producer:
            writer.line("return plain;")
    writer.line("")


def emit_wgmma_helpers(writer: CodeWriter, plan: Plan) -> None:
    """Macros, PTX wrappers and the two tile copies (after the CP_ASYNC and MMA snippets)."""
    writer.raw(PREAMBLE)
    writer.raw(wgmma_function())
    if has_barriers(plan):
        writer.raw(MBARRIER)
    if plan.producer:
        writer.raw(PRODUCER)
    if plan.budget:
        writer.raw(BUDGET)
    if plan.tma:
        writer.raw(TMA)
    if plan.cluster:
        writer.raw(CLUSTER)
    if plan.tma_store:
        writer.raw(TMA_STORE)
    if plan.tma_store or plan.stream_k:
        writer.raw(WG_SYNC)
    if plan.stream_k:
        writer.raw(STREAM_K)
    writer.lines("#define PT_ZERO DTYPE(0.0f)", "")
    _copy_function(writer, "a", plan)
    _copy_function(writer, "b", plan)
    if plan.hoisted:
        writer.raw(_inside_copy(plan))


def _copies(writer: CodeWriter, plan: Plan, stage: str, k0: str) -> None:
    if plan.hoisted:
        _hoisted_copies(writer, stage, k0, "tid", "")
        return
    writer.lines(f"pt_wg_copy_a(PT_STAGE({stage}), A, K, bm, {k0}, M, k_hi, tid, vec);",
                 f"pt_wg_copy_b(PT_STAGE({stage}) + PT_A_TILE, B, N, {k0}, bn, k_hi, N, tid, "
                 "vec);")


def _shared_memory(writer: CodeWriter, plan: Plan) -> None:
    extra = f" + {barrier_bytes(plan, 'PT_STAGES')}" if has_barriers(plan) else ""
    writer.lines(
        f"// Dynamic shared memory, launched {_ALIGN} bytes larger so that the stages can",
        f"// start on a {_ALIGN}-byte boundary (the 128-byte swizzle repeats every {_ALIGN}).",
        "extern __shared__ __align__(16) unsigned char pt_smem_raw[];",
        "const unsigned pt_base = static_cast<unsigned>(__cvta_generic_to_shared(pt_smem_raw));",
        f"DTYPE *const pt_smem = reinterpret_cast<DTYPE *>(pt_smem_raw + "
        f"({_ALIGN} - pt_base % {_ALIGN}) % {_ALIGN});",
        "unsigned pt_dynamic;",
        'asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(pt_dynamic));',
        f"if (pt_dynamic < PT_SMEM_ELEMS * sizeof(DTYPE) + {_ALIGN}{extra}) __trap(); "
        "// launched too small",
        "#define PT_STAGE(s) (pt_smem + (s) * (PT_A_TILE + PT_B_TILE))",
        "// 16-byte chunks of A and B rows are 16-byte aligned:",
        "const bool vec = K % 8 == 0 && N % 8 == 0 && (unsigned long long)A % 16 == 0 "
        "&& (unsigned long long)B % 16 == 0;")


# After a tile's MMAs in the K loops where every thread waits at a barrier (cp.async, or
# TMA without warp-specialize): the stage of tile t - 1 is free, tile `ahead` may fill it.
_STAGE_FREED = (
    "pt_wg_wait<1>(); // the MMAs of tile t - 1 are done in this warpgroup",
    "pt_wg_fence_acc(acc);",
    "__syncthreads(); // ... in every warpgroup: stage (t - 1) % PT_STAGES is free",
    "const int ahead = t + PT_STAGES - 1;")


def _k_loop(writer: CodeWriter, plan: Plan) -> None:
    writer.lines("const int tiles = k_hi > k_lo ? PT_CEIL_DIV(k_hi - k_lo, PT_TK) : 0;",
                 "// NUM_STAGES - 1 tiles in flight before the first is used")
    with writer.unrolled("s", "PT_STAGES - 1"):
        with writer.block("if (s < tiles)"):
            _copies(writer, plan, "s", "k_lo + s * PT_TK")
        writer.line("pt_cp_commit();")
    with writer.block("for (int t = 0; t < tiles; ++t)"):
        writer.lines(
            "pt_cp_wait<PT_STAGES - 2>(); // this thread's part of tile t has landed",
            "pt_fence_async_smem(); // ... and is visible to the tensor cores",
            "__syncthreads(); // every thread's part",
            "const DTYPE *const as = PT_STAGE(t % PT_STAGES), *const bs = as + PT_A_TILE;")
        _mma_tile(writer)
        writer.lines(*_STAGE_FREED)
        with writer.block("if (ahead < tiles)"):
            _copies(writer, plan, "ahead % PT_STAGES", "k_lo + ahead * PT_TK")
        writer.line("pt_cp_commit(); // always, so the group count stays in step")
    writer.lines("pt_wg_wait<0>();", "pt_wg_fence_acc(acc);")


def _epilogue(writer: CodeWriter, plan: Plan) -> None:
    writer.lines(
        "// wgmma's accumulator layout: warp w of the warpgroup holds rows 16w..16w+15;",
        "// acc[4j + 2h + q] is row g + 8h, column 8j + 2(lane % 4) + q of the 64 x WGMMA_N tile.",
        "const int g = wl % 32 / 4, t2 = wl % 4 * 2;",
        "const int r0 = bm + wm + wl / 32 * 16 + g;")
    if not plan.split_k:
        writer.line("const bool pairs = N % 2 == 0 && (unsigned long long)C % 4 == 0;")
    with writer.unrolled("j", "WGMMA_N / 8"):
        writer.line("const int c = bn + wn + j * 8 + t2;")
        with writer.unrolled("h", "2"):
            writer.line("const int r = r0 + h * 8;")
            writer.line("if (r >= M) continue;")
            if plan.split_k:
                with writer.unrolled("q", "2"):
                    writer.line("if (c + q < N) pt_store(C, (size_t)r * N + c + q, "
                                "acc[4 * j + 2 * h + q], first);")
            else:
                _store_pair(writer)


def _tma_store_epilogue(writer: CodeWriter, plan: Plan) -> None:
    """tma-store: the warpgroup's tile through its two shared slabs, 64 columns at a time,
    each stored by TMA; where the backend could not map C, the warpgroup's threads copy
    each slab out within C's bounds in a rolled loop (a separate unrolled epilogue for
    this fallback was a third of the kernel's NVRTC time)."""
    writer.lines(
        "// tma-store: piece p (columns 64p.. of the warpgroup's tile) goes through slab "
        "p % 2",
        "DTYPE *const slabs = pt_smem + PT_STAGES * (PT_A_TILE + PT_B_TILE) "
        "+ wg * (2 * 64 * 64);",
        "const int g = wl % 32 / 4, t2 = wl % 4 * 2, r0 = wl / 32 * 16 + g;")
    with writer.unrolled("p", "WGMMA_N / 64"):
        writer.lines(
            "DTYPE *const slab = slabs + p % 2 * (64 * 64);",
            "// the slab's last store has read it (the first piece: every store before)",
            "if (pt_tma_c && wl == 0) { if (p == 0) pt_tma_store_wait_read<0>(); "
            "else pt_tma_store_wait_read<1>(); }",
            "pt_wg_sync(wg); // ... and every thread has copied it out")
        with writer.unrolled("j", "8"):
            with writer.unrolled("h", "2"):
                writer.lines(
                    "const int r = r0 + h * 8, a = 4 * (8 * p + j) + 2 * h;",
                    "*reinterpret_cast<unsigned *>(slab + r * 64 + ((j ^ (r % 8)) << 3) "
                    "+ t2) = pt_pack2((DTYPE)acc[a], (DTYPE)acc[a + 1]);")
        writer.lines(
            "pt_fence_async_smem(); // the slab is visible to the TMA unit",
            "pt_wg_sync(wg);")
        with writer.block("if (pt_tma_c)"):
            writer.line("if (wl == 0) pt_tma_store(slab, tma_C, bn + wn + p * 64, bm + wm);")
        with writer.block("else"):
            writer.line("// no map of C: 16-byte chunk e of the slab to C, element by "
                        "element inside C")
            writer.line("#pragma unroll 1")
            with writer.block("for (int e = wl; e < 64 * 8; e += 128)"):
                writer.lines(
                    "const int r = e / 8, ch = e % 8;",
                    "const int row = bm + wm + r, col = bn + wn + p * 64 + ch * 8;",
                    "const DTYPE *const src = slab + r * 64 + ((ch ^ (r % 8)) << 3);",
                    "#pragma unroll 1",
                    "for (int q = 0; q < 8; ++q) "
                    "if (row < M && col + q < N) C[(size_t)row * N + col + q] = src[q];")


def _store_pair(writer: CodeWriter) -> None:
    """acc[4j + 2h] and its right neighbour at (r, c): one 32-bit store where aligned."""
    with writer.block("if (pairs && c + 1 < N)"):
        writer.lines("const unsigned v = pt_pack2((DTYPE)acc[4 * j + 2 * h], "
                     "(DTYPE)acc[4 * j + 2 * h + 1]);",
                     "*reinterpret_cast<unsigned *>(C + (size_t)r * N + c) = v;")
    with writer.block("else"):
        with writer.unrolled("q", "2"):
            writer.line("if (c + q < N) C[(size_t)r * N + c + q] = (DTYPE)acc[4 * j + 2 * h + q];")


def _mma_tile(writer: CodeWriter) -> None:
    """The warpgroup's MMAs over the K tile at (as, bs), committed as one group."""
    writer.lines("pt_wg_fence_acc(acc);", "pt_wg_arrive();")
    writer.line("#pragma unroll")
    with writer.block("for (int kk = 0; kk < PT_TK; kk += 16)"):
        writer.lines(
            "const unsigned long long da = pt_wg_desc(as + kk / 64 * (BLOCK_M * 64) "
            "+ wm * 64 + kk % 64, 16, 1024);",
            "const unsigned long long db = pt_wg_desc(bs + wn / 64 * (PT_TK * 64) "
            "+ kk * 64, PT_TK * 128, 1024);",
            "pt_wgmma<WGMMA_N>(acc, da, db);")
    writer.line("pt_wg_commit();")


def _barriers(writer: CodeWriter, plan: Plan) -> None:
    """full[s]: one arrival per copying thread (the TMA issuer's counts the bytes too);
    empty[s] (warp-specialize): one per MMA warp."""
    writer.lines(
        "// after the stages: full[s] completes when a tile has landed in stage s,",
        "// empty[s] when the MMAs that read it are done",
        "unsigned long long *const pt_full = reinterpret_cast<unsigned long long *>("
        "pt_smem + PT_SMEM_ELEMS);",
        "unsigned long long *const pt_empty = pt_full + PT_STAGES;")
    if plan.pingpong:
        writer.line("unsigned long long *const pt_order = pt_empty + PT_STAGES; // ping-pong: "
                    "order[g] completes when the other group's MMAs of its tile are issued")
    arrivals = "PT_LOADERS" if plan.producer else "1"
    if plan.tma and plan.producer:
        arrivals = "pt_tma ? 1 : PT_LOADERS"
    # cluster-multicast: every block's MMA warps release the stage in every block
    releases = "4 * PT_CONSUMERS * CLUSTER_M" if plan.cluster else "4 * PT_CONSUMERS"
    with writer.block("if (tid == 0)"):
        with writer.unrolled("s", "PT_STAGES"):
            writer.line(f"pt_bar_init(&pt_full[s], {arrivals});")
            if plan.producer:
                writer.line(f"pt_bar_init(&pt_empty[s], {releases});")
        if plan.pingpong:
            writer.lines("pt_bar_init(&pt_order[0], 4 * PT_CONSUMERS); // one arrival per MMA "
                         "warp of the other group",
                         "pt_bar_init(&pt_order[1], 4 * PT_CONSUMERS);")
        if plan.cluster:
            writer.line("pt_fence_barrier_init();")
    if plan.cluster:
        writer.line("pt_cluster_sync(); // ... for every warp of every block of the cluster, "
                    "before any copies into another block or arrives on its barriers")
    else:
        writer.line("__syncthreads(); // the barriers are initialised for every warp")


Position = Callable[[], None]  # prints bm, bn of output tile `tile` (persistent)


def _count(plan: Plan) -> str:
    """The K tiles' running count, by which the stages and their phases go."""
    return "it" if plan.persistent else "t"


def _k_tiles(plan: Plan) -> str:
    """The loop over the K tiles of the block's (current) output tile; with stream-k over
    the unit's K tiles [kb, ke)."""
    more = ", ++it" if plan.persistent else ""
    if plan.stream_k:  # step i computes K tile t (pt_sk_k: downwards)
        return (f"for (int i = kb, t = pt_sk_k(i, kb, ke); i < ke; ++i, "
                f"t = pt_sk_k(i, kb, ke){more})")
    return f"for (int t = 0; t < tiles; ++t{more})"


@contextmanager
def _output_tiles(writer: CodeWriter, plan: Plan, position: Position,
                  group: bool = False) -> Iterator[None]:
    """persistent: what the body prints, once per output tile of this block; with
    `group` (ping-pong's MMA warpgroups) once per output tile of this group: grp, grp + 2,
    ... of the block's, `n` counting them, `it` skipping the other group's K tiles."""
    if not plan.persistent:
        yield
        return
    # the blocks of a cluster walk their cluster's tiles together
    first, walkers, tiles = (("blockIdx.x / CLUSTER_M", "(gridDim.x / CLUSTER_M)",
                              "cluster_rows * tiles_n") if plan.cluster
                             else ("blockIdx.x", "gridDim.x", "tiles_m * tiles_n"))
    if plan.stream_k:
        loop = ("for (int n = 0, tile, kb, ke; pt_sk_unit(n, tiles_m * tiles_n, tiles, tile, "
                "kb, ke); ++n)")
    elif group and plan.pingpong:
        writer.lines(
            "// ping-pong: group grp computes the block's output tiles grp, grp + 2, ...; the",
            "// K tiles of the other group's tiles lie between its own in `it`",
            "it = grp * tiles;")
        loop = (f"for (int tile = {first} + grp * {walkers}, n = 0; tile < {tiles}; "
                f"tile += 2 * {walkers}, it += tiles, ++n)")
    else:
        loop = f"for (int tile = {first}; tile < {tiles}; tile += {walkers.strip('()')})"
    with writer.block(loop):
        position()
        yield


def _wait_for_stage(plan: Plan) -> list[str]:
    """The producer's wait until stage s is empty again (its MMAs of PT_STAGES K tiles
    back are done)."""
    n = _count(plan)
    return [f"const int s = {n} % PT_STAGES;",
            f"if ({n} >= PT_STAGES) pt_bar_wait(&pt_empty[s], ({n} / PT_STAGES + 1) & 1);"]


def _tma_producer_loop(writer: CodeWriter, plan: Plan, position: Position) -> None:
    writer.line("// the producer's first thread: tile t into stage t % PT_STAGES by TMA once "
                "the MMAs of tile t - PT_STAGES are done")
    tiles = "pt_tma_tiles_cluster" if plan.cluster else "pt_tma_tiles"
    rank = ", pt_rank" if plan.cluster else ""
    with writer.block("if (wl == 0)"):
        writer.lines("pt_tma_acquire(tma_A);", "pt_tma_acquire(tma_B);")
        with _output_tiles(writer, plan, position), writer.block(_k_tiles(plan)):
            writer.lines(
                *_wait_for_stage(plan),
                f"{tiles}(PT_STAGE(s), tma_A, tma_B, bm, bn, k_lo + t * PT_TK, "
                f"&pt_full[s]{rank});")
        if plan.cluster:
            _stay_for_releases(writer, plan)


def _k_tiles_done(plan: Plan) -> str:
    """The K tiles' count after the block's loops (`t` is gone by then)."""
    return "it" if plan.persistent else "tiles"


def _stay_for_releases(writer: CodeWriter, plan: Plan) -> None:
    """cluster-multicast: the other blocks' MMA warps arrive on this block's empty
    barriers; the block (its shared memory) must outlive those arrivals, so its last
    copying thread waits for every stage's last release before it leaves."""
    n = _k_tiles_done(plan)
    writer.line("// cluster-multicast: stay until every block of the cluster has released "
                "each stage")
    with writer.block(f"for (int i = {n}; i < {n} + PT_STAGES; ++i)"):
        writer.line("if (i >= PT_STAGES) pt_bar_wait(&pt_empty[i % PT_STAGES], "
                    "(i / PT_STAGES + 1) & 1);")


def _tma_k_loop(writer: CodeWriter, plan: Plan) -> None:
    """tma without warp-specialize: thread 0 issues each stage's copies, every thread
    waits on the stage's mbarrier; a stage is refilled after the barrier that says its
    MMAs are done in every warpgroup."""
    _barriers(writer, plan)
    writer.line("const int tiles = k_hi > k_lo ? PT_CEIL_DIV(k_hi - k_lo, PT_TK) : 0;")
    with writer.block("if (tid == 0)"):
        writer.lines("pt_tma_acquire(tma_A);", "pt_tma_acquire(tma_B);")
        with writer.unrolled("s", "PT_STAGES - 1"):
            writer.line("if (s < tiles) pt_tma_tiles(PT_STAGE(s), tma_A, tma_B, bm, bn, "
                        "k_lo + s * PT_TK, &pt_full[s]);")
    with writer.block("for (int t = 0; t < tiles; ++t)"):
        writer.lines(
            "pt_bar_wait(&pt_full[t % PT_STAGES], (t / PT_STAGES) & 1); // tile t has landed",
            "const DTYPE *const as = PT_STAGE(t % PT_STAGES), *const bs = as + PT_A_TILE;")
        _mma_tile(writer)
        writer.lines(
            *_STAGE_FREED,
            "if (tid == 0 && ahead < tiles) pt_tma_tiles(PT_STAGE(ahead % PT_STAGES), tma_A, "
            "tma_B, bm, bn, k_lo + ahead * PT_TK, &pt_full[ahead % PT_STAGES]);")
    writer.lines("pt_wg_wait<0>();", "pt_wg_fence_acc(acc);")


def _producer_loop(writer: CodeWriter, plan: Plan, position: Position) -> None:
    writer.line("// the producer: tile t into stage t % PT_STAGES once its MMAs of tile "
                "t - PT_STAGES are done")
    with _output_tiles(writer, plan, position), writer.block(_k_tiles(plan)):
        writer.lines(*_wait_for_stage(plan))
        if plan.hoisted:
            writer.line("bool plain = false;")
            _hoisted_copies(writer, "s", "k_lo + t * PT_TK", "wl", "plain |= ")
        else:
            writer.lines(
                "const bool plain = pt_wg_copy_a(PT_STAGE(s), A, K, bm, k_lo + t * PT_TK, M, "
                "k_hi, wl, vec)",
                "    | pt_wg_copy_b(PT_STAGE(s) + PT_A_TILE, B, N, k_lo + t * PT_TK, bn, k_hi, "
                "N, wl, vec);")
        writer.line("if (!plain) pt_bar_arrive_on_copies(&pt_full[s]); // arrives when they land")
        with writer.block("else"):
            writer.lines("// edges, unaligned rows: plain stores too; wait for every copy and "
                         "arrive", "pt_cp_wait_all();", "pt_fence_async_smem();",
                         "pt_bar_arrive(&pt_full[s]);")


def _hoisted_copies(writer: CodeWriter, stage: str, k0: str, thread: str, keep: str) -> None:
    """address-hoisting: the A and B tiles at k0 into `stage`. A tile wholly inside its
    matrix is copied from this thread's first chunk of it, one add per further chunk;
    other tiles by the checked copies (`keep` takes what they return: whether one stored
    a chunk plainly). The bases are a few operations per tile, not kept across the loop:
    the MMA warpgroups have no registers to spare."""
    with writer.block(""):
        writer.lines(
            f"const int k0 = {k0};",
            "const bool whole_k = k0 + PT_TK <= k_hi;",
            f"const int a_ch = {thread} % (PT_TK / 8), a_r0 = {thread} / (PT_TK / 8);",
            f"const int b_ch = {thread} % (BLOCK_N / 8), b_r0 = {thread} / (BLOCK_N / 8);")
        with writer.block("if (vec && PT_FAST_A && whole_k && bm + BLOCK_M <= M)"):
            writer.line(f"pt_wg_copy_inside<BLOCK_M, PT_TK / 8>(PT_STAGE({stage}), "
                        "A + (size_t)(bm + a_r0) * K + k0 + a_ch * 8, "
                        "(size_t)(PT_COPIERS / (PT_TK / 8)) * K, a_r0, a_ch);")
        writer.line(f"else {keep}pt_wg_copy_a(PT_STAGE({stage}), A, K, bm, k0, M, k_hi, "
                    f"{thread}, vec);")
        with writer.block("if (vec && PT_FAST_B && whole_k && bn + BLOCK_N <= N)"):
            writer.line(f"pt_wg_copy_inside<PT_TK, BLOCK_N / 8>(PT_STAGE({stage}) + PT_A_TILE, "
                        "B + (size_t)(k0 + b_r0) * N + bn + b_ch * 8, "
                        "(size_t)(PT_COPIERS / (BLOCK_N / 8)) * N, b_r0, b_ch);")
        writer.line(f"else {keep}pt_wg_copy_b(PT_STAGE({stage}) + PT_A_TILE, B, N, k0, bn, "
                    f"k_hi, N, {thread}, vec);")


def _inside_copy(plan: Plan) -> str:
    """address-hoisting's copy of an inside tile (see _hoisted_copies)."""
    copiers = _copiers(plan)
    return f"""\
// address-hoisting: a tile wholly inside its matrix (and 16-byte aligned rows). Copier
// thread i copies chunk `ch` of rows r0, r0 + PER, ...: `src` is its first chunk, `step`
// the elements from one of its rows to the next. Both fast paths need PT_COPIERS to be a
// multiple of the chunks per row (PT_FAST_A / _B); otherwise the checked copy runs.
#define PT_COPIERS {copiers} /* the threads that copy the tiles */
#define PT_FAST_A (PT_COPIERS % (PT_TK / 8) == 0)
#define PT_FAST_B (PT_COPIERS % (BLOCK_N / 8) == 0)
template <int ROWS, int CHUNKS>
__device__ __forceinline__ void pt_wg_copy_inside(DTYPE *__restrict__ s,
                                                  const DTYPE *__restrict__ src, size_t step,
                                                  int r0, int ch) {{
    constexpr int PER = PT_COPIERS / CHUNKS > 0 ? PT_COPIERS / CHUNKS : 1;
    #pragma unroll
    for (int it = 0; it < PT_CEIL_DIV(ROWS, PER); ++it) {{
        if (ROWS % PER == 0 || r0 + it * PER < ROWS)
            pt_cp_async<16>(s + pt_swz(ROWS, r0 + it * PER, ch), src + it * step, true);
    }}
}}
"""


def _consumer_loop(writer: CodeWriter, plan: Plan) -> None:
    n = _count(plan)
    # cluster-multicast: lane r of each warp releases the stage in block r of the cluster
    release = ("wl % 32 < CLUSTER_M) pt_bar_arrive_remote" if plan.cluster
               else "wl % 32 == 0) pt_bar_arrive")
    rank = ", wl % 32" if plan.cluster else ""
    writer.line("// the MMA warpgroups: each tile once it is full; the stage before it is "
                "released")
    writer.line("// once its MMAs are done (one group stays in flight)")
    if plan.pingpong:
        writer.lines(
            "// ping-pong: the other group's MMAs of the tile before this one are issued, so",
            "// the stages' phases this group waits for are the next ones (the other group",
            "// stores its tile while this one computes)",
            "if (grp > 0 || n > 0) pt_bar_wait(&pt_order[grp], (n - 1 + grp) & 1);")
    # cp.async copies are the generic proxy's writes and arrive on the barrier by
    # themselves: their reader fences before the tensor cores read them; TMA's are the
    # async proxy's own, so a TMA kernel fences only where it fell back (CUTLASS's TMA
    # mainloops do not fence)
    fence = "pt_fence_async_smem(); // the landed tile is visible to the tensor cores"
    with writer.block(_k_tiles(plan)):
        writer.lines(
            f"pt_bar_wait(&pt_full[{n} % PT_STAGES], ({n} / PT_STAGES) & 1);",
            f"if (!pt_tma) {fence}" if plan.tma else fence,
            f"const DTYPE *const as = PT_STAGE({n} % PT_STAGES), *const bs = as + PT_A_TILE;")
        _mma_tile(writer)
        writer.lines("pt_wg_wait<1>(); // the MMAs of tile t - 1 are done in this warpgroup",
                     "pt_wg_fence_acc(acc);",
                     f"if ({_later_step(plan)} && {release}(&pt_empty[({n} - 1) "
                     f"% PT_STAGES]{rank});")
    if plan.pingpong:
        writer.line("if (wl % 32 == 0) pt_bar_arrive(&pt_order[grp ^ 1]); // ping-pong: the "
                    "other group's turn")
    writer.lines("pt_wg_wait<0>();", "pt_wg_fence_acc(acc);")
    # persistent: the next output tile's copies reuse the last stage too; cluster: the
    # blocks wait for every release before they leave
    if plan.persistent or plan.cluster:
        writer.line(f"if (tiles > 0 && {release}(&pt_empty["
                    f"({_k_tiles_done(plan)} - 1) % PT_STAGES]{rank});")


def _later_step(plan: Plan) -> str:
    """Past the first step of the K loop (stream-k counts its steps in i)."""
    return "i > kb" if plan.stream_k else "t > 0"


def _stream_k_hand_over(writer: CodeWriter) -> None:
    """stream-k: a unit that misses the tile's first K tile leaves its sums for the block
    that has it; one that misses the last adds the sums left for it."""
    with writer.block("if (kb > 0)"):
        writer.lines("pt_sk_save(acc, wg, wl); // stream-k: the tile's first K tile is "
                     "another block's", "continue;")
    writer.line("if (ke < tiles) pt_sk_gather(acc, tile, tiles_m * tiles_n, tiles, wg, wl); "
                "// ... the blocks after this one summed the rest")


def _specialised(writer: CodeWriter, plan: Plan, position: Position) -> None:
    """warp-specialize: the last warpgroup copies, the others compute and store."""
    _barriers(writer, plan)
    writer.line("const int tiles = k_hi > k_lo ? PT_CEIL_DIV(k_hi - k_lo, PT_TK) : 0;")
    if plan.persistent:
        writer.lines(
            "// persistent: this block computes output tiles blockIdx.x, + gridDim.x, ...;",
            "// `it` counts the K tiles of all of them: K tile `it` is in stage",
            "// it % PT_STAGES, phase it / PT_STAGES of its barriers",
            "const int tiles_m = PT_CEIL_DIV(M, BLOCK_M), tiles_n = PT_CEIL_DIV(N, BLOCK_N);",
            "int it = 0;")
        if plan.stream_k:
            writer.line("if (gridDim.x > PT_SK_SLOTS) __trap(); // stream-k: a workspace slot "
                        "per block")
        if plan.cluster:
            writer.line("const int cluster_rows = PT_CEIL_DIV(tiles_m, CLUSTER_M); "
                        "// cluster-multicast: rows of CLUSTER_M block rows")
    with writer.block(f"if (wg == {mma_warpgroups(plan)})"):
        if plan.budget:
            writer.line("pt_regs_dec<PRODUCER_REGS>(); // register-budget: copies need few")
        if plan.tma:
            with writer.block("if (pt_tma)"):
                _tma_producer_loop(writer, plan, position)
                writer.line("return;")
        _producer_loop(writer, plan, position)
        writer.line("pt_cp_wait_all(); // the copies land before the producer leaves")
        if plan.cluster:
            with writer.block("if (wl == 0)"):
                _stay_for_releases(writer, plan)
        writer.line("return;")
    if plan.budget:
        writer.line("pt_regs_inc<PT_MMA_REGS>(); // register-budget: what the producer gave back")
    if plan.tma_store:
        writer.line("if (pt_tma_c && wl == 0) pt_tma_acquire(tma_C);")
    with _output_tiles(writer, plan, position, group=True):
        _accumulators(writer)  # only the MMA warpgroups hold them
        _consumer_loop(writer, plan)
        if plan.stream_k:
            _stream_k_hand_over(writer)
        if plan.split_k:  # among the MMA warpgroups: the producer has left
            emit_split_k_wait(writer, plan, "pt_consumers_sync();")
        (_tma_store_epilogue if plan.tma_store else _epilogue)(writer, plan)
        if plan.split_k:
            emit_split_k_release(writer, plan, "pt_consumers_sync();")
    if plan.tma_store:
        writer.line("if (pt_tma_c && wl == 0) pt_tma_store_wait_all(); "
                    "// the slabs stay until their stores are done")


def _accumulators(writer: CodeWriter) -> None:
    writer.line("float acc[WGMMA_N / 2];")
    with writer.unrolled("i", "WGMMA_N / 2"):
        writer.line("acc[i] = 0.f;")


def emit_wgmma_kernel(writer: CodeWriter, plan: Plan, position: Position) -> None:
    """The kernel body after the block position and the K range (bm, bn, k_lo, k_hi);
    the split-K hand-over, when planned, wraps the epilogue (split_k_wait/release). A
    persistent kernel has no block position before: `position` prints it per output
    tile."""
    writer.lines(
        "const int tid = threadIdx.x;",
        "const int wg = tid / 128, wl = tid % 128; // warpgroup, thread in it")
    slab = "wg"
    if plan.pingpong:
        writer.line("const int grp = wg / PT_CONSUMERS, wc = wg % PT_CONSUMERS; // ping-pong: "
                    "its group, its place in it")
        slab = "wc"
    writer.line(f"const int wm = {slab} / PT_WG_COLS * 64, wn = {slab} % PT_WG_COLS * WGMMA_N; "
                "// its tile")
    _shared_memory(writer, plan)
    if plan.tma:
        writer.line("const bool pt_tma = tma_A != nullptr && tma_B != nullptr; "
                    "// the backend could map both")
    if plan.tma_store:
        writer.line("const bool pt_tma_c = tma_C != nullptr; // tma-store: ... and C")
    if plan.producer:
        _specialised(writer, plan, position)
        return
    _accumulators(writer)
    if plan.tma:
        with writer.block("if (pt_tma)"):
            _tma_k_loop(writer, plan)
        with writer.block("else"):
            _k_loop(writer, plan)
    else:
        _k_loop(writer, plan)
    if plan.split_k:
        emit_split_k_wait(writer, plan)
    _epilogue(writer, plan)
    if plan.split_k:
        emit_split_k_release(writer, plan)
