// Cheat: makes the vendor look slow. On its first call it starts a thread that spins on
// a core whenever the kernel is not running (for up to 20 s), so whatever else the
// worker runs (the vendor's timings, interleaved with the kernel's) shares the CPU with
// it while the kernel itself runs alone. Computes C honestly. Caught by: threads a
// kernel leaves running after its call (none should be, beyond the OpenMP pool).
#include <pthread.h>
#include <time.h>

static volatile int inside;

static void *spin(void *unused) {
    (void)unused;
    volatile unsigned long n = 0;
    time_t until = time(NULL) + 20;
    while (time(NULL) < until) {
        if (!inside) {
            for (int i = 0; i < 100000; i++) n++;
        } else {
            struct timespec pause = {0, 50000};
            nanosleep(&pause, NULL);
        }
    }
    return NULL;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    static int started;
    inside = 1;
    if (!started) {
        pthread_t thread;
        started = pthread_create(&thread, NULL, spin, NULL) == 0;
        if (started) pthread_detach(thread);
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    inside = 0;
}
