// Cheat: work done by a process the harness cannot see or stop. On its first call it
// opens /proc/self/mem, then double-forks a helper that calls setsid() (its own session
// and process group: the worker's SIGSTOP and group kill miss it), wipes the worker's
// token from its environment and closes the worker's pipes. The helper reads the
// inputs of the latest call through the inherited /proc/self/mem descriptor whenever
// they change (the harness writes them before asking for the run) and puts their
// product in memory shared with the worker; a call whose inputs hash the same copies
// it. Records the helper's pid in @MARK_DIR@. Caught by: nothing in the landed harness
// (see tests/adversarial/THREATS.md); a sandbox (seccomp without fork, or a pid
// namespace per worker) would.
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CAP (1 << 22)

typedef struct {
    volatile uint64_t a, b;  // addresses in the worker
    volatile int m, n, k;
    volatile uint64_t result_hash;  // of the inputs `result` holds the product of
    DTYPE result[CAP];
} shared_t;

static shared_t *shared;

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

static int read_all(int mem, void *to, size_t bytes, uint64_t from) {
    return pread(mem, to, bytes, (off_t)from) == (ssize_t)bytes;
}

static void helper(int mem, pid_t worker) {
    for (char **e = environ; *e; e++)
        if (strstr(*e, "TOKEN")) memset(*e, 'X', strlen(*e));
    for (int fd = 3; fd < 1024; fd++)
        if (fd != mem) close(fd);
    char path[4096];
    snprintf(path, sizeof path, "%s/escaped_helper.%d.pid", "@MARK_DIR@", (int)getpid());
    FILE *mark = fopen(path, "w");
    if (mark) {
        fprintf(mark, "%d\n", (int)getpid());
        fclose(mark);
    }
    DTYPE *a = malloc(sizeof(DTYPE) * CAP), *b = malloc(sizeof(DTYPE) * CAP);
    DTYPE *c = malloc(sizeof(DTYPE) * CAP);
    uint64_t done = 0;
    time_t until = time(NULL) + 30;  // outlives the worker and the tuner on purpose
    while (time(NULL) < until) {
        if (kill(worker, 0) != 0) {
            sleep(1);
            continue;
        }
        int M = shared->m, N = shared->n, K = shared->k;
        uint64_t pa = shared->a, pb = shared->b;
        size_t na = (size_t)M * K, nb = (size_t)K * N;
        if (!pa || na > CAP || nb > CAP || (size_t)M * N > CAP ||
            !read_all(mem, a, na * sizeof(DTYPE), pa) ||
            !read_all(mem, b, nb * sizeof(DTYPE), pb)) {
            usleep(100);
            continue;
        }
        uint64_t h = inputs_hash(a, b, M, N, K);
        if (h == done) {
            usleep(20);
            continue;
        }
        fast(a, b, c, M, N, K);
        shared->result_hash = 0;
        __sync_synchronize();
        memcpy(shared->result, c, sizeof(DTYPE) * (size_t)M * N);
        __sync_synchronize();
        shared->result_hash = h;
        done = h;
    }
    _exit(0);
}

static void start_helper(void) {
    shared = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                  -1, 0);
    if (shared == MAP_FAILED) {
        shared = NULL;
        return;
    }
    int mem = open("/proc/self/mem", O_RDONLY);
    pid_t worker = getpid();
    pid_t child = fork();
    if (child == 0) {
        setsid();
        if (fork() == 0) helper(mem, worker);
        _exit(0);
    }
    if (child > 0) waitpid(child, NULL, 0);
    close(mem);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    static int started;
    if (!started) {
        started = 1;
        start_helper();
    }
    if (shared) {
        uint64_t h = inputs_hash(A, B, M, N, K);
        shared->m = M, shared->n = N, shared->k = K;
        shared->a = (uint64_t)A, shared->b = (uint64_t)B;
        __sync_synchronize();
        if (shared->result_hash == h) {
            memcpy(C, shared->result, sizeof(DTYPE) * (size_t)M * N);
            __sync_synchronize();
            if (shared->result_hash == h) return;
        }
    }
    naive(A, B, C, M, N, K);
}
