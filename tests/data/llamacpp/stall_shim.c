/* A stall of llama-server's inference thread alone, loaded with LD_PRELOAD by the
 * real-llama.cpp tests (tests/e2e/test_llamacpp.py).
 *
 * llama-server runs every llama_decode() on its main thread, and ggml's CPU backend (built with
 * OpenMP) enters each graph computation through libgomp's GOMP_parallel. This shim wraps that
 * entry: while the file named by ENGINE_WATCHDOG_TEST_STALL_TRIGGER exists, the thread that
 * computes waits on a condition variable inside engine_watchdog_test_stall(), in the middle of
 * a decode, as a hung kernel or collective would hold it. The HTTP threads and the queue's
 * worker thread (which answers /metrics and /slots while a decode runs) are not touched.
 * Removing the file lets the decode go on within 50 ms. A file named TRIGGER.PID stalls only
 * the server of that PID (a restarted server, another PID, serves).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

static pthread_mutex_t stall_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stall_cond = PTHREAD_COND_INITIALIZER;

static int triggered(const char *trigger) {
    char own[4096];
    if (access(trigger, F_OK) == 0) {
        return 1;
    }
    snprintf(own, sizeof own, "%s.%d", trigger, (int)getpid());
    return access(own, F_OK) == 0;
}

__attribute__((noinline)) void engine_watchdog_test_stall(const char *trigger) {
    pthread_mutex_lock(&stall_mutex);
    while (triggered(trigger)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&stall_cond, &stall_mutex, &until);
    }
    pthread_mutex_unlock(&stall_mutex);
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static gomp_parallel_fn real;
    if (real == NULL) {
        real = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    }
    const char *trigger = getenv("ENGINE_WATCHDOG_TEST_STALL_TRIGGER");
    if (trigger != NULL && triggered(trigger)) {
        engine_watchdog_test_stall(trigger);
    }
    real(fn, data, num_threads, flags);
}
