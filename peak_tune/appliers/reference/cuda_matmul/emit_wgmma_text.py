"""The fixed text of the Hopper warpgroup kernel (emit_wgmma prints the rest from the
plan): the wgmma, descriptor, mbarrier, producer and TMA helpers as CUDA with inline
PTX, and the one wgmma.mma_async statement per instruction shape."""

from __future__ import annotations

__all__ = ["CLUSTER", "MBARRIER", "PREAMBLE", "PRODUCER", "TMA", "TMA_STORE", "WGMMA_SHAPES",
           "wgmma_function"]

WGMMA_SHAPES = (64, 128, 256)  # the instruction N this module prints (WGMMA_N values)

PREAMBLE = """\
// wgmma (sm_90a): warpgroup MMAs m64nNk16 reading A and B from shared memory.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma needs the sm_90a target (Hopper): build this variant with -arch=sm_90a"
#endif
#define PT_WG_COLS (BLOCK_N / WGMMA_N) /* warpgroups along N */
static_assert(BLOCK_M % 64 == 0 && BLOCK_N % WGMMA_N == 0, "warpgroup tiles (64 x WGMMA_N) "
              "must cover the block tile");
static_assert(WGMMA_N == 64 || WGMMA_N == 128 || WGMMA_N == 256, "WGMMA_N is 64, 128 or 256");
static_assert(PT_TK % 64 == 0, "the 128-byte swizzle needs TILE_K_SIZE % 64 == 0");
// Element offset of 16-byte chunk `ch` of row `r` in a swizzled tile of `rows` rows.
__device__ __forceinline__ int pt_swz(int rows, int r, int ch) {
    return (ch >> 3) * rows * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
}
// Shared-memory matrix descriptor: start address, leading and stride byte offsets
// (all >> 4), 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ unsigned long long pt_wg_desc(const DTYPE *p, unsigned lbo,
                                                         unsigned sbo) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    return static_cast<unsigned long long>((a & 0x3FFFF) >> 4)
        | (static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16)
        | (static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ void pt_wg_arrive() {
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
}
__device__ __forceinline__ void pt_wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void pt_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\\n" :: "n"(PENDING) : "memory");
}
// Shared memory written by cp.async or plain stores is read next by the tensor cores
// (the async proxy): each writing thread fences before the barrier.
__device__ __forceinline__ void pt_fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma fences/waits.
template <int R>
__device__ __forceinline__ void pt_wg_fence_acc(float (&d)[R]) {
    #pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}"""


MBARRIER = """\
// mbarriers in shared memory hand each stage from whoever fills it to the MMA
// warpgroups (tile full) and, with warp-specialize, back (stage empty).
__device__ __forceinline__ unsigned pt_smem_addr(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void pt_bar_init(unsigned long long *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n" :: "r"(pt_smem_addr(bar)),
                 "r"(count) : "memory");
}
// One arrival (release: this thread's earlier writes are visible to the waiters).
__device__ __forceinline__ void pt_bar_arrive(unsigned long long *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(pt_smem_addr(bar))
                 : "memory");
}
// Wait until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void pt_bar_wait(unsigned long long *bar, unsigned parity) {
    asm volatile("{\\n.reg .pred done;\\nPT_WAIT:\\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n"
                 "@!done bra PT_WAIT;\\n}\\n" :: "r"(pt_smem_addr(bar)), "r"(parity)
                 : "memory");
}"""

PRODUCER = """\
// warp-specialize: one arrival, made by the hardware once this thread's cp.async copies
// issued so far have landed; the thread goes on at once.
__device__ __forceinline__ void pt_bar_arrive_on_copies(unsigned long long *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\\n"
                 :: "r"(pt_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void pt_cp_wait_all() {
    asm volatile("cp.async.wait_all;\\n" ::: "memory");
}
// A barrier of the MMA warpgroups alone (named barrier 1; the producer has left).
__device__ __forceinline__ void pt_consumers_sync() {
    asm volatile("bar.sync 1, %0;\\n" :: "n"(PT_CONSUMERS * 128) : "memory");
}"""

BUDGET = """\
// register-budget: the warpgroup's registers per thread set to R, a multiple of 8 (all
// its threads execute it; ptxas allocates the code after it within R). dec gives
// registers back to the SM, inc waits until enough are free.
template <int R> __device__ __forceinline__ void pt_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\\n" :: "n"(R));
}
template <int R> __device__ __forceinline__ void pt_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\\n" :: "n"(R));
}"""

TMA = """\
// tma: the Tensor Memory Accelerator copies a whole box, a 64-element (128-byte) slab of
// BLOCK_M or PT_TK rows, swizzled as the stages are, from a tensor map that the backend
// encodes (launch keys tma_A, tma_B) and passes in global memory; the stage's mbarrier
// counts the bytes that have landed. Elements outside the matrix arrive as zeros.
__device__ __forceinline__ void pt_tma_acquire(const void *map) {
    // the maps were copied from the host before the launch
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\\n" :: "l"(map)
                 : "memory");
}
__device__ __forceinline__ void pt_bar_expect(unsigned long long *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
                 :: "r"(pt_smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void pt_tma_load(DTYPE *dst, const void *map, int col, int row,
                                            unsigned long long *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                 ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\\n"
                 :: "r"(pt_smem_addr(dst)), "l"(map), "r"(col), "r"(row),
                 "r"(pt_smem_addr(bar)) : "memory");
}
// The A and B tiles at k0 into `stage`; `bar` completes when all their bytes have landed.
__device__ __forceinline__ void pt_tma_tiles(DTYPE *stage, const void *ma, const void *mb,
                                             int bm, int bn, int k0, unsigned long long *bar) {
    pt_bar_expect(bar, (PT_A_TILE + PT_B_TILE) * sizeof(DTYPE));
    #pragma unroll
    for (int i = 0; i < PT_TK / 64; ++i)
        pt_tma_load(stage + i * (BLOCK_M * 64), ma, k0 + i * 64, bm, bar);
    #pragma unroll
    for (int j = 0; j < BLOCK_N / 64; ++j)
        pt_tma_load(stage + PT_A_TILE + j * (PT_TK * 64), mb, bn + j * 64, k0, bar);
}"""


CLUSTER = """\
// cluster-multicast: the CLUSTER_M blocks of a thread-block cluster compute CLUSTER_M
// block rows of one column of C, so they read the same B tiles: each block loads
// PT_TK / CLUSTER_M rows of each one by TMA into every block of the cluster (multicast).
static_assert(PT_TK % (8 * CLUSTER_M) == 0, "a block's share of a B slab is whole "
              "8-row swizzle atoms: TILE_K_SIZE % (8 * CLUSTER_M) == 0");
__device__ __forceinline__ int pt_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\\n" : "=r"(r));
    return static_cast<int>(r);
}
// mbarriers just initialised are seen by the cluster's other blocks (the initialising
// thread, before pt_cluster_sync)
__device__ __forceinline__ void pt_fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
}
// Every thread of every block of the cluster arrives, then waits for all the others.
__device__ __forceinline__ void pt_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\\n"
                 "barrier.cluster.wait.acquire.aligned;\\n" ::: "memory");
}
// One arrival on `bar`'s counterpart (same offset) in block `rank` of the cluster. Lane r
// of each MMA warp signals block r, so a warp's CLUSTER_M arrivals go out in one
// instruction; CTA scope as CUTLASS's cluster barriers (a cluster-scope release made each
// arrival wait for a cluster-wide fence).
__device__ __forceinline__ void pt_bar_arrive_remote(unsigned long long *bar, int rank) {
    asm volatile("{\\n.reg .b32 remote;\\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\\n}\\n"
                 :: "r"(pt_smem_addr(bar)), "r"(rank) : "memory");
}
// One box into `dst` of every block in `mask`; each one's mbarrier at `bar`'s offset
// counts the bytes that land in it.
__device__ __forceinline__ void pt_tma_multicast(DTYPE *dst, const void *map, int col, int row,
                                                 unsigned long long *bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                 ".mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], "
                 "%5;\\n"
                 :: "r"(pt_smem_addr(dst)), "l"(map), "r"(col), "r"(row),
                 "r"(pt_smem_addr(bar)), "h"(mask) : "memory");
}
// The block's A tile at (bm, k0), and its share (rows rank * part ...) of the B tile at
// (k0, bn) for every block of the cluster. `bar` completes once the A tile and every
// block's share of B have landed here: the whole tiles' bytes, as without a cluster.
__device__ __forceinline__ void pt_tma_tiles_cluster(DTYPE *stage, const void *ma,
                                                     const void *mb, int bm, int bn, int k0,
                                                     unsigned long long *bar, int rank) {
    constexpr int part = PT_TK / CLUSTER_M;
    pt_bar_expect(bar, (PT_A_TILE + PT_B_TILE) * sizeof(DTYPE));
    #pragma unroll
    for (int i = 0; i < PT_TK / 64; ++i)
        pt_tma_load(stage + i * (BLOCK_M * 64), ma, k0 + i * 64, bm, bar);
    #pragma unroll
    for (int j = 0; j < BLOCK_N / 64; ++j)
        pt_tma_multicast(stage + PT_A_TILE + j * (PT_TK * 64) + rank * part * 64, mb,
                         bn + j * 64, k0 + rank * part, bar,
                         static_cast<unsigned short>((1u << CLUSTER_M) - 1));
}"""


TMA_STORE = """\
// tma-store: each MMA warpgroup stores its 64 x WGMMA_N tile of C 64 columns at a time:
// its threads write the 64 x 64 piece into one of the warpgroup's two shared slabs,
// swizzled as the operand tiles are (row r's 16-byte chunk ch at chunk ch ^ (r % 8): the
// warp's stores hit 32 different banks), and one thread stores the slab with TMA, which
// leaves out whatever lies outside C.
__device__ __forceinline__ void pt_tma_store(const DTYPE *src, const void *map, int col,
                                             int row) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"
                 " [%0, {%1, %2}], [%3];\\n"
                 :: "l"(map), "r"(col), "r"(row), "r"(pt_smem_addr(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;\\n" ::: "memory");
}
// Until at most PENDING of this thread's stores still read their slabs.
template <int PENDING>
__device__ __forceinline__ void pt_tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\\n" :: "n"(PENDING) : "memory");
}
// Until this thread's stores are done (before the block leaves).
__device__ __forceinline__ void pt_tma_store_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");
}"""

# tma-store and stream-k: a barrier of one MMA warpgroup's threads
WG_SYNC = """\
// The 128 threads of MMA warpgroup wg (named barriers 2, 3, ...; 1 is the MMA warpgroups').
__device__ __forceinline__ void pt_wg_sync(int wg) {
    asm volatile("bar.sync %0, 128;\\n" :: "r"(2 + wg) : "memory");
}"""

STREAM_K = """\
// stream-k: the output tiles that fill whole waves of the grid (pt_sk_dp of them) go
// whole to one block each (tile % gridDim.x); the K tiles of the rest, the last partial
// wave, counted tile by tile, are shared out evenly in runs of consecutive K tiles: block
// b takes [pt_sk_lo(b), pt_sk_lo(b + 1)). A block that does not hold a tile's first K
// tile leaves its fp32 sums in its workspace slot and raises its warpgroups' flags; the
// block that holds the first K tile (its run ends inside the tile) adds the sums of the
// blocks after it and stores C. A block leaves sums only from the first piece of its
// run, before it waits on anyone, and waits only on blocks after it: no cycle, so
// nothing hangs while the whole grid is resident (one block per SM). The slots are
// module globals, the flags reset by their reader for the next launch.
#define PT_SK_SLOTS 160 /* stream-k: workspace slots, one per block (a Hopper GPU's SMs) */
#define PT_SK_MIN_RUN 8 /* stream-k: K tiles a block's run has at least, where it can */
__device__ float4 pt_sk_sums[PT_SK_SLOTS * (BLOCK_M * BLOCK_N / 4)];
__device__ unsigned pt_sk_ready[PT_SK_SLOTS * PT_CONSUMERS];
// Output tiles dealt out whole (K == 0: all of them, each stored as zeros).
__device__ __forceinline__ int pt_sk_dp(int total, int ktiles) {
    return ktiles > 0 ? total / (int)gridDim.x * (int)gridDim.x : total;
}
// Where block b's run starts among the K tiles of the tiles after pt_sk_dp: b * shared / g
// for the first g blocks, which are one a tile at least and more only while the runs stay
// PT_SK_MIN_RUN K tiles long (a few K tiles would cost more to hand over than they save);
// the blocks after them have empty runs. 32-bit arithmetic (shared < gridDim.x * ktiles):
// a 64-bit division is a called subroutine, around which the MMA warpgroups spill.
__device__ __forceinline__ int pt_sk_lo(int b, int total, int ktiles) {
    const int left = total - pt_sk_dp(total, ktiles), shared = left * ktiles;
    if (shared == 0) return 0;
    const int g = min((int)gridDim.x, max(left, shared / PT_SK_MIN_RUN));
    b = min(b, g);
    return b * (shared / g) + b * (shared % g) / g;
}
// This block's unit of work n: K tiles [kb, ke) of output tile `tile`; false past its last.
__device__ __forceinline__ bool pt_sk_unit(int n, int total, int ktiles, int &tile, int &kb,
                                           int &ke) {
    const int dp = pt_sk_dp(total, ktiles), whole = PT_CEIL_DIV(dp, (int)gridDim.x);
    if (n < whole) {
        tile = blockIdx.x + n * gridDim.x, kb = 0, ke = ktiles;
        return tile < dp;
    }
    const int lo = pt_sk_lo(blockIdx.x, total, ktiles);
    const int hi = pt_sk_lo(blockIdx.x + 1, total, ktiles);
    // the first piece starts where the run does, each later one at a tile's first K tile
    const int start = n == whole ? lo : (lo / ktiles + n - whole) * ktiles;
    if (start >= hi) return false;
    tile = dp + start / ktiles, kb = start % ktiles;
    ke = min(ktiles, hi - (start - kb));
    return true;
}
// The K tile a unit computes at its step i (kb <= i < ke): downwards from ke - 1 where
// SK_DOWNWARDS is 1, else upwards from kb (the tuner's choice). A run's first piece ends
// at the last K tile and its second starts at K tile 0, so walked downwards every block
// of the shared wave is at K tile ktiles - 1 - s or L - 1 - s at step s of its run (L its
// length): the blocks read the same few K tiles of A and B at a time, as a wave of whole
// tiles does, where upwards they spread over all of K. On an H100 downwards ran 6% faster
// at 4096 and upwards 1% faster at 8192.
__device__ __forceinline__ int pt_sk_k(int i, int kb, int ke) {
    return SK_DOWNWARDS ? kb + ke - 1 - i : i;
}
// Warpgroup wg's sums of a tile it does not finish: into this block's slot, in register
// order (thread wl's float4 q at q * 128 + wl), then its flag (release).
__device__ __forceinline__ void pt_sk_save(const float (&acc)[WGMMA_N / 2], int wg, int wl) {
    float4 *const slot = pt_sk_sums + (size_t)blockIdx.x * (BLOCK_M * BLOCK_N / 4)
        + wg * (64 * WGMMA_N / 4);
    #pragma unroll
    for (int q = 0; q < WGMMA_N / 8; ++q)
        __stcg(slot + q * 128 + wl, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2],
                                                acc[4 * q + 3]));
    __threadfence(); // this thread's sums are visible GPU-wide ...
    pt_wg_sync(wg); // ... and every thread's, before the flag
    if (wl == 0) {
        __threadfence(); // the release: after the barrier, as CUTLASS's flags do
        atomicExch(&pt_sk_ready[blockIdx.x * PT_CONSUMERS + wg], 1u);
    }
}
// Warpgroup wg holds K tile 0 of `tile` but not its last: adds the sums the blocks after
// this one left for it (those whose runs start inside the tile and are not empty).
__device__ __forceinline__ void pt_sk_gather(float (&acc)[WGMMA_N / 2], int tile, int total,
                                             int ktiles, int wg, int wl) {
    const int end = (tile - pt_sk_dp(total, ktiles) + 1) * ktiles;
    for (int c = blockIdx.x + 1; c < (int)gridDim.x; ++c) {
        const int lo = pt_sk_lo(c, total, ktiles);
        if (lo >= end) break;
        if (pt_sk_lo(c + 1, total, ktiles) == lo) continue; // an empty run left nothing
        unsigned *const ready = &pt_sk_ready[c * PT_CONSUMERS + wg];
        if (wl == 0) {
            unsigned raised = 0;
            do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\\n" : "=r"(raised)
                            : "l"(ready) : "memory");
            while (raised == 0);
            atomicExch(ready, 0u); // for the next launch (only this warpgroup reads it)
        }
        pt_wg_sync(wg); // the sums are there for every thread
        const float4 *const slot = pt_sk_sums + (size_t)c * (BLOCK_M * BLOCK_N / 4)
            + wg * (64 * WGMMA_N / 4);
        #pragma unroll
        for (int q = 0; q < WGMMA_N / 8; ++q) {
            const float4 v = __ldcg(slot + q * 128 + wl); // from L2: another SM wrote it
            acc[4 * q] += v.x, acc[4 * q + 1] += v.y, acc[4 * q + 2] += v.z,
                acc[4 * q + 3] += v.w;
        }
    }
}"""


def _wgmma_asm(n: int, kind: str) -> str:
    """One wgmma.mma_async m64{n}k16 statement: A K-major, B N-major (imm-trans-b 1)."""
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    text = (f'"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} '
            f'{{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 1;\\n}}\\n"')
    constraints = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return (f"asm volatile({text}\n"
            f"                     : {constraints}\n"
            f'                     : "l"(da), "l"(db), "r"(1));')


def wgmma_function() -> str:
    lines = ["// d (64 x N per warpgroup, fp32) += A (64 x 16, descriptor da) * B (16 x N, da).",
             "template <int N>",
             "__device__ __forceinline__ void pt_wgmma(float (&d)[N / 2], unsigned long long da,",
             "                                         unsigned long long db) {"]
    for index, n in enumerate(WGMMA_SHAPES):
        head = "if" if index == 0 else "} else if"
        lines.append(f"    {head} constexpr (N == {n}) {{")
        lines.append("        if constexpr (pt_is_bf16<DTYPE>::value)")
        lines.append("            " + _wgmma_asm(n, "bf16"))
        lines.append("        else")
        lines.append("            " + _wgmma_asm(n, "f16"))
    lines += ["    }", "}"]
    return "\n".join(lines)
