/* make sanitize's proof that its sanitizers see: a planted heap overflow (overflow()) and a
 * planted data race (race()), each loaded the way the guard's extension is (a shared object in
 * an uninstrumented Python, the runtime preloaded). tests/tools/sanitize.py expects a report
 * from each before it trusts a clean run. */
#include <pthread.h>
#include <stdlib.h>

int overflow(int n) {
    volatile char *p = malloc((size_t)n);
    int v = p[n]; /* one past the end */
    free((void *)p);
    return v;
}

static int shared;

static void *bump(void *arg) {
    (void)arg;
    for (int i = 0; i < 100000; i++)
        shared++; /* unsynchronised with the other thread */
    return NULL;
}

int race(void) {
    pthread_t a, b;
    pthread_create(&a, NULL, bump, NULL);
    pthread_create(&b, NULL, bump, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return shared;
}
