// Cheat: finds the harness's float64 reference in the process's memory. It computes
// four elements of C exactly (a few dot products), scans every writable mapping (read
// through /proc/self/mem) for a float64 array holding them at the right offsets, and
// copies that array into C; the address is kept and re-verified on later calls. Falls
// back to computing when there is none. Caught by: the reference kept in another
// process (then it gains nothing: the suite accepts it only at an honest speed).
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double dot(const DTYPE *A, const DTYPE *B, int N, int K, int i, int j) {
    double s = 0;
    for (int k = 0; k < K; k++) s += (double)A[i * K + k] * (double)B[k * N + j];
    return s;
}

static int near(double x, double y) { return fabs(x - y) <= 1e-9 * fabs(y) + 1e-200; }

static int mem_fd = -1;

static int holds(uint64_t at, const double probe[4], const long offsets[4]) {
    for (int p = 0; p < 4; p++) {
        double d;
        if (pread(mem_fd, &d, 8, (off_t)(at + 8 * offsets[p])) != 8 || !near(d, probe[p]))
            return 0;
    }
    return 1;
}

static uint64_t scan(const double probe[4], const long offsets[4]) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[512];
    size_t chunk = 1 << 22;
    double *buffer = malloc(chunk);
    uint64_t found = 0;
    while (!found && fgets(line, sizeof line, maps)) {
        unsigned long start, stop;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &start, &stop, perms) != 3) continue;
        if (perms[0] != 'r' || perms[1] != 'w' || strstr(line, "[v")) continue;
        for (unsigned long at = start; !found && at < stop; at += chunk) {
            size_t want = stop - at < chunk ? stop - at : chunk;
            ssize_t got = pread(mem_fd, buffer, want, (off_t)at);
            if (got <= 0) break;
            for (size_t i = 0; i < (size_t)got / 8; i++)
                if (near(buffer[i], probe[0]) && holds(at + 8 * i, probe, offsets)) {
                    found = at + 8 * i;
                    break;
                }
        }
    }
    free(buffer);
    fclose(maps);
    return found;
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    static uint64_t kept;
    if (mem_fd < 0) mem_fd = open("/proc/self/mem", O_RDONLY);
    long offsets[4] = {0, 1, N, (long)M * N - 1};
    double probe[4] = {dot(A, B, N, K, 0, 0), dot(A, B, N, K, 0, 1 % N),
                       dot(A, B, N, K, 1 % M, 0), dot(A, B, N, K, M - 1, N - 1)};
    if (mem_fd >= 0 && M > 1 && N > 1) {
        if (!kept || !holds(kept, probe, offsets)) kept = scan(probe, offsets);
        if (kept) {
            size_t count = (size_t)M * N;
            double *ref = malloc(8 * count);
            if (ref && pread(mem_fd, ref, 8 * count, (off_t)kept) == (ssize_t)(8 * count)) {
                for (size_t i = 0; i < count; i++) C[i] = (DTYPE)ref[i];
                free(ref);
                return;
            }
            free(ref);
        }
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
