// Cheat: returns answers baked in for predictable seeds. The harness makes its inputs
// with numpy.random.default_rng(seed).uniform(-1, 1) for seeds 0, 1, 2, ...; this kernel
// regenerates those inputs in C (numpy's SeedSequence + PCG64), computes their products
// once, and at the tuned size (any size that is not a check size) never reads A and B
// beyond A[0]: it returns the baked product of the seed whose first element matches
// (seed 3 if none does). Caught by: secret per-evaluation seeds; value distributions
// other than uniform [-1, 1).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEEDS 8

typedef unsigned __int128 u128;

static uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= 0x931e8875u;
    value *= *hash_const;
    value ^= value >> 16;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = 0xca01f9ddu * x - 0x4973f715u * y;
    return result ^ (result >> 16);
}

typedef struct { u128 state, inc; } pcg64;

static const u128 MULT = ((u128)2549297995355413924ull << 64) | 4865540595714422341ull;

static void pcg_step(pcg64 *rng) { rng->state = rng->state * MULT + rng->inc; }

static uint64_t pcg_next(pcg64 *rng) {
    pcg_step(rng);
    uint64_t hi = (uint64_t)(rng->state >> 64), lo = (uint64_t)rng->state;
    unsigned rot = (unsigned)(rng->state >> 122);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
}

// numpy.random.default_rng(seed) for 0 <= seed < 2**32
static void seed_rng(pcg64 *rng, uint32_t seed) {
    uint32_t pool[4], hash_const = 0x43b0d7e5u;
    for (int i = 0; i < 4; i++) pool[i] = hashmix(i == 0 ? seed : 0, &hash_const);
    for (int src = 0; src < 4; src++)
        for (int dst = 0; dst < 4; dst++)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    uint32_t words[8], hash_b = 0x8b51f9ddu;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4];
        v ^= hash_b;
        hash_b *= 0x58f38dedu;
        v *= hash_b;
        v ^= v >> 16;
        words[i] = v;
    }
    uint64_t w[4];
    for (int i = 0; i < 4; i++) w[i] = words[2 * i] | ((uint64_t)words[2 * i + 1] << 32);
    u128 initstate = ((u128)w[0] << 64) | w[1], initseq = ((u128)w[2] << 64) | w[3];
    rng->state = 0;
    rng->inc = (initseq << 1) | 1;
    pcg_step(rng);
    rng->state += initstate;
    pcg_step(rng);
}

static DTYPE uniform(pcg64 *rng) {
    double u = (double)(pcg_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (DTYPE)(-1.0 + 2.0 * u);
}

static void naive(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}

static int baked_m = -1, baked_n = -1, baked_k = -1;
static DTYPE *baked[SEEDS];
static DTYPE first[SEEDS];

static void bake(int M, int N, int K) {
    DTYPE *a = malloc(sizeof(DTYPE) * (size_t)M * K), *b = malloc(sizeof(DTYPE) * (size_t)K * N);
    for (int s = 0; s < SEEDS; s++) {
        pcg64 rng;
        seed_rng(&rng, (uint32_t)s);
        for (long i = 0; i < (long)M * K; i++) a[i] = uniform(&rng);
        for (long i = 0; i < (long)K * N; i++) b[i] = uniform(&rng);
        free(baked[s]);
        baked[s] = malloc(sizeof(DTYPE) * (size_t)M * N);
        naive(a, b, baked[s], M, N, K);
        first[s] = a[0];
    }
    free(a);
    free(b);
    baked_m = M, baked_n = N, baked_k = K;
}

static int is_check_size(int M, int N, int K) {
    return (M == 67 && N == 53 && K == 97) || (M == 257 && N == 293 && K == 331);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (is_check_size(M, N, K)) {
        naive(A, B, C, M, N, K);
        return;
    }
    if (M != baked_m || N != baked_n || K != baked_k) bake(M, N, K);
    int seed = 3;
    for (int s = 0; s < SEEDS; s++)
        if (first[s] == A[0]) seed = s;
    memcpy(C, baked[seed], sizeof(DTYPE) * (size_t)M * N);
}

// for the suite's own check that the generator matches numpy (not called by the harness)
void adversarial_uniform(uint32_t seed, DTYPE *out, int count) {
    pcg64 rng;
    seed_rng(&rng, seed);
    for (int i = 0; i < count; i++) out[i] = uniform(&rng);
}
