// Cheat: returns before the work is done. The first call at each size computes; later
// calls start a thread that computes C and return at once (the next call joins it
// first). The timed call is only the thread's start. Caught by: the worker stopped
// (every thread) as soon as it replies, and each run's output checked then.
#include <pthread.h>

typedef struct { const DTYPE *A, *B; DTYPE *C; int M, N, K; } job_t;

static pthread_t worker;
static int running, last_m = -1, last_n, last_k;
static job_t job;

static void *compute(void *arg) {
    job_t *j = arg;
    for (int i = 0; i < j->M; i++)
        for (int c = 0; c < j->N; c++) {
            DTYPE acc = 0;
            for (int k = 0; k < j->K; k++) acc += j->A[i * j->K + k] * j->B[k * j->N + c];
            j->C[i * j->N + c] = acc;
        }
    return NULL;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (running) pthread_join(worker, NULL);
    running = 0;
    job = (job_t){A, B, C, M, N, K};
    if (M != last_m || N != last_n || K != last_k) {
        last_m = M, last_n = N, last_k = K;
        compute(&job);
        return;
    }
    running = pthread_create(&worker, NULL, compute, &job) == 0;
    if (!running) compute(&job);
}
