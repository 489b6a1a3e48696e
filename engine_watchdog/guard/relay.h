/* The relay thread's state, shared by the thread (guard/relay_thread.c) and its Python types
 * (guard/_relay.c). No Python header is included here or in the thread's file: the thread
 * cannot touch a Python object, so it never needs the GIL. Every field below is read and
 * written under the pump's mutex, except the fds and buffers the thread alone uses while it
 * serves. */
#ifndef ENGINE_WATCHDOG_RELAY_H
#define ENGINE_WATCHDOG_RELAY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "llhttp.h"
#include "sse.h"

#define READ_MAX 65536

enum { IDLE, ADOPTED, RETURNED, TAKEN };

struct lane {
    int state;
    int efd, cfd; /* the lane's own duplicates of the engine's and the client's sockets */
    uint32_t slot;
    int framed, broken, unsent;
    int err; /* the errno of the read that failed: the event loop then reads only the end */
    struct progress *progress; /* the stream's (its Progress object's), the thread's while adopted */
    llhttp_t http;   /* the response's framing from the chunk boundary it was adopted at */
    long long events; /* tokens counted, not yet taken */
    long long reads;  /* reads served, not yet taken */
    struct hist gaps; /* gaps counted, not yet taken */
    char *back; /* handed back: the read untouched (unsent 0) or output not sent (1) */
    size_t nback;
};

struct pump {
    pthread_mutex_t mu;
    pthread_t thread;
    int started, running, stopping;
    int forked; /* this is a forked child's copy: no thread here, and the kernel objects (epoll,
                   eventfds) are the parent's too: never touched */
    int ep, wake, stop; /* epoll; eventfd to Python (hand-backs); eventfd to the thread */
    struct lane **table; /* slot -> adopted or returned lane */
    uint32_t *gens;
    uint32_t cap;
    struct lane **queue; /* returned lanes, for Python to take */
    size_t nqueue;
    char *buf;
    struct bounds bounds;
    long long served, handed_back, partial;
    struct pump *next; /* the live pumps, for the fork handlers */
};

/* Its descriptors, buffer and table, and its thread started: 0, or an errno. The caller has
 * set ep, wake and stop to -1, bounds, and initialised the mutex. */
int pump_open(struct pump *p);
/* Stop and join the thread: every lane still adopted is handed back (blocks: no GIL held). */
void pump_stop(struct pump *p);
void pump_free(struct pump *p);
/* The lane into the table and epoll (its fds dup'd, its parser at a chunk boundary): 0; -1
 * where the thread has stopped or could not take it. */
int pump_adopt(struct pump *p, struct lane *l);
/* The mutex held: the lane out of the table and the queue, its fds closed, IDLE. */
void pump_release(struct pump *p, struct lane *l);
/* The mutex held: a returned lane is Python's (its slot free again), TAKEN. */
void pump_taken(struct pump *p, struct lane *l);

#endif
