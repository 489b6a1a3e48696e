/* The steady relay's state, shared by its thread (guard/_lane_thread.c) and its Python types
 * (guard/_lane.c). No Python header is included here or in the thread's file: the thread cannot
 * touch a Python object, so it never needs the GIL. Every field below is read and written under
 * the pump's mutex, except the fds and buffers the thread alone uses while it serves. */
#ifndef ENGINE_WATCHDOG_LANE_H
#define ENGINE_WATCHDOG_LANE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_BOUNDS 64
#define MAX_KEY 64
#define READ_MAX 65536

enum { IDLE, ADOPTED, RETURNED, TAKEN };

struct lane {
    int state;
    int efd, cfd; /* the lane's own duplicates of the engine's and the client's sockets */
    uint32_t slot;
    int framed, broken, unsent;
    int err; /* the errno of the read that failed: the event loop then reads only the end */
    char key[MAX_KEY];
    size_t klen, hint;
    double last_t;    /* when the stream's last token passed */
    long long events; /* counted, not yet taken */
    double gap_total;
    long long gaps[MAX_BOUNDS + 1];
    char *back; /* handed back: the read untouched (unsent 0) or output not sent (1) */
    size_t nback;
};

struct pump {
    pthread_mutex_t mu;
    pthread_t thread;
    int started, running, stopping;
    int ep, wake, stop; /* epoll; eventfd to Python (hand-backs); eventfd to the thread */
    struct lane **table; /* slot -> adopted or returned lane */
    uint32_t *gens;
    uint32_t cap;
    struct lane **queue; /* returned lanes, for Python to take */
    size_t nqueue;
    char *buf;
    int nbounds;
    double bounds[MAX_BOUNDS];
    long long served, handed_back, partial;
};

/* Its descriptors, buffer and table, and its thread started: 0, or an errno. The caller has
 * set ep, wake and stop to -1 and initialised the mutex. */
int pump_open(struct pump *p);
/* Stop and join the thread: every lane still adopted is handed back (blocks: no GIL held). */
void pump_stop(struct pump *p);
void pump_free(struct pump *p);
/* The lane into the table and epoll (its fds dup'd): 0; -1 where the thread has stopped. */
int pump_adopt(struct pump *p, struct lane *l);
/* The mutex held: the lane out of the table and the queue, its fds closed, IDLE. */
void pump_release(struct pump *p, struct lane *l);
/* The mutex held: a returned lane is Python's (its slot free again), TAKEN. */
void pump_taken(struct pump *p, struct lane *l);

#endif
