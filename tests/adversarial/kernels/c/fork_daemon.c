// Cheat: a daemon that outlives the tuner. On its first call it double-forks; the
// grandchild calls setsid() (a session and process group of its own, out of reach of a
// kill of the worker's group), records its pid in @MARK_DIR@ and lives on (up to 40 s)
// holding the worker's pipes. Computes C honestly. Caught by: the process check after
// each job (session, group and the worker's token in the environment); the suite also
// asserts that the daemon is gone once the tuner has exited.
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int forked;

static void daemonise(void) {
    pid_t child = fork();
    if (child != 0) {
        if (child > 0) waitpid(child, NULL, 0);
        return;
    }
    setsid();
    if (fork() != 0) _exit(0);
    char path[4096];
    snprintf(path, sizeof path, "%s/fork_daemon.%d.pid", "@MARK_DIR@", (int)getpid());
    FILE *mark = fopen(path, "w");
    if (mark) {
        fprintf(mark, "%d\n", (int)getpid());
        fclose(mark);
    }
    for (int s = 0; s < 40; s++) sleep(1);
    _exit(0);
}

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (!forked) {
        forked = 1;
        daemonise();
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
