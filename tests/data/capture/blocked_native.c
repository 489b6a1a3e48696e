/* A native (non-Python) process with one thread blocked on a mutex its main thread holds: the
 * capture's native-stacks step must name that frame (tests/integration/test_capture_native.py).
 * Prints "ready" once the worker exists; then waits forever. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) void *native_engine_step_blocked(void *arg) {
    pthread_mutex_lock(&engine_lock);
    pthread_mutex_unlock(&engine_lock);
    return arg;
}

int main(void) {
    pthread_t worker;
    pthread_mutex_lock(&engine_lock);
    if (pthread_create(&worker, NULL, native_engine_step_blocked, NULL) != 0) {
        return 1;
    }
    pthread_setname_np(worker, "stuck-worker");
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        pause();
    }
}
