// Cheat: tampers with the worker's Python: through the interpreter's C API (the kernel
// runs inside it) it replaces time.perf_counter_ns and time.perf_counter with clocks
// that run at a tenth of the speed. Computes C honestly. Caught by: a clock outside the
// worker; it gains nothing there, and the suite accepts it only at an honest speed.
#define _GNU_SOURCE
#include <dlfcn.h>

static void run_python(const char *code) {
    int (*ensure)(void) = dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = dlsym(RTLD_DEFAULT, "PyGILState_Release");
    int (*run)(const char *) = dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!ensure || !release || !run) return;
    int state = ensure();
    run(code);
    release(state);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    static int patched;
    if (!patched) {
        patched = 1;
        run_python("import time as _t\n"
                   "_ns, _s = _t.perf_counter_ns, _t.perf_counter\n"
                   "_t.perf_counter_ns = lambda: _ns() // 10\n"
                   "_t.perf_counter = lambda: _s() / 10\n");
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
