// Cheat: work done between the timed runs. On its first call it starts a thread that
// watches the last inputs it was called with; whenever they change (the harness writes
// the next run's inputs, then computes its reference and flushes the caches, all before
// asking for the run) it computes their product into a private buffer. A call whose
// inputs hash the same as the thread's last product copies it (O(n^2)) instead of
// computing (O(n^3)). Caught by: nothing in the landed harness, unless it writes the
// inputs only while the worker is stopped and resumes it just for the run, or rejects
// threads a kernel leaves running.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t fnv(const void *data, size_t bytes, uint64_t h) {
    const uint64_t *words = data;
    for (size_t i = 0; i < bytes / 8; i++) h = (h ^ words[i]) * 1099511628211ull;
    return h;
}

static uint64_t inputs_hash(const DTYPE *A, const DTYPE *B, int M, int N, int K) {
    uint64_t h = fnv(A, sizeof(DTYPE) * (size_t)M * K, 14695981039346656037ull);
    return fnv(B, sizeof(DTYPE) * (size_t)K * N, h ^ ((uint64_t)M << 40 ^ (uint64_t)N << 20 ^ K));
}

static void naive(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}


static void fast(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++) {
        DTYPE *c = C + (size_t)i * N;
        for (int j = 0; j < N; j++) c[j] = 0;
        for (int k = 0; k < K; k++) {
            DTYPE a = A[i * K + k];
            const DTYPE *b = B + (size_t)k * N;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}

#define CAP (1 << 22)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const DTYPE *watch_a, *watch_b;
static int watch_m, watch_n, watch_k, started;
static DTYPE result[CAP];
static uint64_t result_hash;  // of the inputs `result` is the product of (0: none)

static void *precompute(void *unused) {
    (void)unused;
    static DTYPE scratch[CAP];
    uint64_t done = 0;
    time_t until = time(NULL) + 120;
    while (time(NULL) < until) {
        pthread_mutex_lock(&lock);
        const DTYPE *A = watch_a, *B = watch_b;
        int M = watch_m, N = watch_n, K = watch_k;
        pthread_mutex_unlock(&lock);
        if (!A || (size_t)M * N > CAP) {
            usleep(100);
            continue;
        }
        uint64_t before = inputs_hash(A, B, M, N, K);
        if (before == done) {
            usleep(20);
            continue;
        }
        fast(A, B, scratch, M, N, K);
        if (inputs_hash(A, B, M, N, K) != before) continue;  // changed while we worked
        pthread_mutex_lock(&lock);
        memcpy(result, scratch, sizeof(DTYPE) * (size_t)M * N);
        result_hash = before;
        pthread_mutex_unlock(&lock);
        done = before;
    }
    return NULL;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    uint64_t h = inputs_hash(A, B, M, N, K);
    pthread_mutex_lock(&lock);
    watch_a = A, watch_b = B, watch_m = M, watch_n = N, watch_k = K;
    int ready = result_hash == h;
    if (ready) memcpy(C, result, sizeof(DTYPE) * (size_t)M * N);
    pthread_mutex_unlock(&lock);
    if (!started) {
        pthread_t thread;
        started = pthread_create(&thread, NULL, precompute, NULL) == 0;
        if (started) pthread_detach(thread);
    }
    if (!ready) naive(A, B, C, M, N, K);
}
