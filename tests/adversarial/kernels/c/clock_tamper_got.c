// Cheat: tampers with the worker's clock. On its first call it rewrites the
// clock_gettime slot in the global offset table of every object loaded in the process
// (the interpreter's time.perf_counter_ns calls through one) to a clock that runs at a
// tenth of the speed while the kernel runs: the worker's own timing of each call reads
// 10x fast. Computes C honestly. Caught by: a clock outside the worker (the judge's
// round trip bounds each run from below); it gains nothing there, and the suite accepts
// it only at an honest speed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int (*real_clock)(clockid_t, struct timespec *);
static volatile int64_t stolen_ns;  // taken off every later reading
static volatile int64_t entered_ns;

static int64_t now_ns(clockid_t id) {
    struct timespec ts;
    real_clock(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int slow_clock(clockid_t id, struct timespec *ts) {
    int r = real_clock(id, ts);
    if (r == 0 && id != CLOCK_REALTIME) {
        int64_t t = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec - stolen_ns;
        ts->tv_sec = t / 1000000000;
        ts->tv_nsec = t % 1000000000;
    }
    return r;
}

static uintptr_t absolute(const struct dl_phdr_info *info, uintptr_t address) {
    return address < info->dlpi_addr ? address + info->dlpi_addr : address;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *count) {
    (void)size;
    if (strstr(info->dlpi_name, "linux-vdso")) return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *tables[2] = {NULL, NULL};
    size_t sizes[2] = {0, 0};
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) symtab = (const void *)absolute(info, dyn->d_un.d_ptr);
        if (dyn->d_tag == DT_STRTAB) strtab = (const void *)absolute(info, dyn->d_un.d_ptr);
        if (dyn->d_tag == DT_JMPREL) tables[0] = (const void *)absolute(info, dyn->d_un.d_ptr);
        if (dyn->d_tag == DT_PLTRELSZ) sizes[0] = dyn->d_un.d_val;
        if (dyn->d_tag == DT_RELA) tables[1] = (const void *)absolute(info, dyn->d_un.d_ptr);
        if (dyn->d_tag == DT_RELASZ) sizes[1] = dyn->d_un.d_val;
    }
    if (!symtab || !strtab) return 0;
    long page = sysconf(_SC_PAGESIZE);
    for (int t = 0; t < 2; t++)
        for (size_t r = 0; tables[t] && r < sizes[t] / sizeof(ElfW(Rela)); r++) {
            const ElfW(Rela) *rel = &tables[t][r];
            unsigned type = ELF64_R_TYPE(rel->r_info);
            if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
            const char *name = strtab + symtab[ELF64_R_SYM(rel->r_info)].st_name;
            if (strcmp(name, "clock_gettime")) continue;
            void **slot = (void **)(info->dlpi_addr + rel->r_offset);
            void *start = (void *)((uintptr_t)slot & ~(uintptr_t)(page - 1));
            mprotect(start, page, PROT_READ | PROT_WRITE);
            *slot = (void *)slow_clock;
            ++*(int *)count;
        }
    return 0;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    static int patched;
    if (!patched) {
        real_clock = dlsym(RTLD_DEFAULT, "clock_gettime");
        int count = 0;
        dl_iterate_phdr(patch_object, &count);
        patched = 1;
    }
    entered_ns = now_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    stolen_ns += (now_ns(CLOCK_MONOTONIC) - entered_ns) * 9 / 10;
}
