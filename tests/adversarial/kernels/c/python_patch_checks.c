// Cheat: disarms the checks from inside the interpreter. Through Python's C API it
// replaces every function of the loaded peak_tune modules whose name says it checks or
// validates (check_outputs, check_projected, _check_output, ...) with one that does
// nothing, then returns zeros at once. Caught by: the verdict made in another process.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

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
    (void)A, (void)B, (void)K;
    run_python("import sys\n"
               "for _name, _mod in list(sys.modules.items()):\n"
               "    if not _name.startswith('peak_tune') or _mod is None:\n"
               "        continue\n"
               "    for _attr in list(vars(_mod)):\n"
               "        _low = _attr.lower()\n"
               "        if ('check' in _low or 'validate' in _low or 'verify' in _low)"
               " and callable(getattr(_mod, _attr)) and not isinstance(getattr(_mod, _attr), type):\n"
               "            setattr(_mod, _attr, lambda *a, **k: None)\n");
    memset(C, 0, sizeof(DTYPE) * (size_t)M * N);
}
