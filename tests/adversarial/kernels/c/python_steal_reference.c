// Cheat: copies the harness's own answer. Through Python's C API it walks the frames
// of the interpreter that called it, looking for the float64 reference of this run (a
// local `expected` with .values, or any float64 array of C's shape that is not C), and
// copies it into C. Falls back to computing when there is none. Caught by: the
// reference kept in another process (then it gains nothing: the suite accepts it only
// at an honest speed).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

static volatile int stolen;

static void run_python(const char *code) {
    int (*ensure)(void) = dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = dlsym(RTLD_DEFAULT, "PyGILState_Release");
    int (*run)(const char *) = dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!ensure || !release || !run) return;
    int state = ensure();
    run(code);
    release(state);
}

static const char STEAL[] =
    "import sys, ctypes\n"
    "import numpy as _np\n"
    "def _steal(c_address, m, n, flag):\n"
    "    out = _np.ctypeslib.as_array((ctypes.c_%s * (m * n)).from_address(c_address))\n"
    "    frame = sys._getframe()\n"
    "    while frame is not None:\n"
    "        for value in list(frame.f_locals.values()):\n"
    "            candidates = [value]\n"
    "            if hasattr(value, 'values') and isinstance(getattr(value, 'values'), dict):\n"
    "                candidates += list(value.values.values())\n"
    "            for c in candidates:\n"
    "                if isinstance(c, _np.ndarray) and c.dtype == _np.float64 and "
    "c.shape == (m, n) and not _np.shares_memory(c, out):\n"
    "                    out[...] = c.reshape(-1)\n"
    "                    ctypes.c_int.from_address(flag).value = 1\n"
    "                    return\n"
    "        frame = frame.f_back\n"
    "_steal(%lu, %d, %d, %lu)\n";

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    char code[4096];
    stolen = 0;
    snprintf(code, sizeof code, STEAL, sizeof(DTYPE) == 4 ? "float" : "double",
             (unsigned long)C, M, N, (unsigned long)&stolen);
    run_python(code);
    if (stolen) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
