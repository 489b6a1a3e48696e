/* The steady relay's thread (guard/lanes.py says what it serves and what it hands back; the
 * Python types are guard/_lane.c). This file includes no Python header: nothing here can touch
 * a Python object, so the thread never needs the GIL and never waits on the interpreter. */
#define _GNU_SOURCE /* memmem */
#include "lane.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNKS 64
#define STOP_TAG UINT64_MAX

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time()'s clock: the guard's default */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Off epoll, its sockets closed. Its slot stays taken until Python takes the lane (returned()
 * or reclaim): the queue then never holds more lanes than the table has slots. */
static void unhook(struct pump *p, struct lane *l) {
    epoll_ctl(p->ep, EPOLL_CTL_DEL, l->efd, NULL);
    close(l->efd);
    close(l->cfd);
    l->efd = l->cfd = -1;
}

/* The stream goes back to Python with `n` bytes: the read (unsent 0) or unsent output (1). */
static void give_back(struct pump *p, struct lane *l, const char *data, size_t n, int unsent) {
    unhook(p, l);
    l->back = NULL;
    l->nback = 0;
    l->unsent = unsent;
    if (n) {
        l->back = malloc(n);
        if (l->back == NULL)
            l->broken = 1; /* Python ends the request: its bytes are lost */
        else {
            memcpy(l->back, data, n);
            l->nback = n;
        }
    }
    l->state = RETURNED;
    p->queue[p->nqueue++] = l; /* room: queue and table have the same capacity */
    p->handed_back++;
    uint64_t one = 1;
    ssize_t w = write(p->wake, &one, sizeof one);
    (void)w; /* an eventfd's counter only fails to take 1 at 2^64 - 2 */
}

static int is_hex(char c, unsigned *v) {
    if (c >= '0' && c <= '9')
        *v = (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
        *v = (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
        *v = (unsigned)(c - 'A' + 10);
    else
        return 0;
    return 1;
}

/* Whether one event's line has the key before a non-empty string (see _side.c steady_token:
 * any such place means Scan counts the event too). */
static int carries(struct lane *l, const char *line, size_t n) {
    const char *at = NULL;
    if (l->hint + l->klen < n && memcmp(line + l->hint, l->key, l->klen) == 0)
        at = line + l->hint;
    else {
        at = memmem(line, n, l->key, l->klen);
        if (at == NULL)
            return 0;
        l->hint = (size_t)(at - line);
    }
    return at + l->klen < line + n && at[l->klen] != '"';
}

/* The events of one chunk's data if all are steady (single-line, no CR, carrying), else 0. */
static long long events_in(struct lane *l, const char *d, size_t n) {
    if (memchr(d, '\r', n) != NULL)
        return 0;
    long long count = 0;
    size_t at = 0;
    while (at < n) {
        const char *nl = memchr(d + at, '\n', n - at);
        if (nl == NULL)
            return 0;
        size_t end = (size_t)(nl - d);
        if (end + 1 >= n || d[end + 1] != '\n' || !carries(l, d + at, end - at))
            return 0;
        count++;
        at = end + 2;
    }
    return count;
}

/* The read as whole chunks of steady events: their data in iov[1..k]; the events; 0: not. */
static int steady_read(struct lane *l, const char *b, size_t n, struct iovec *iov, long long *events) {
    size_t at = 0;
    int k = 0;
    *events = 0;
    while (at < n) {
        size_t size = 0, digits = 0;
        unsigned v;
        while (at + digits < n && is_hex(b[at + digits], &v)) {
            if (++digits > 8)
                return 0;
            size = size * 16 + v;
        }
        at += digits;
        if (digits == 0 || size == 0 || n - at < 2 || b[at] != '\r' || b[at + 1] != '\n')
            return 0;
        at += 2;
        if (n - at < size + 2 || b[at + size] != '\r' || b[at + size + 1] != '\n')
            return 0;
        long long c = events_in(l, b + at, size);
        if (c == 0 || k == MAX_CHUNKS)
            return 0;
        iov[1 + k].iov_base = (void *)(b + at);
        iov[1 + k].iov_len = size;
        k++;
        *events += c;
        at += size + 2;
    }
    return k;
}

static void note(struct pump *p, struct lane *l, long long events) {
    double now = now_s(), gap = now - l->last_t;
    int i = 0;
    while (i < p->nbounds && p->bounds[i] < gap) /* bisect_left */
        i++;
    l->gaps[i]++;
    l->gap_total += gap;
    l->last_t = now;
    l->events += events;
}

/* The rest of a write the client did not take, handed back for Python to write first. */
static void give_back_rest(struct pump *p, struct lane *l, struct iovec *iov, int niov, size_t sent) {
    size_t total = 0;
    for (int i = 0; i < niov; i++)
        total += iov[i].iov_len;
    char *rest = malloc(total - sent), *w = rest;
    for (int i = 0; rest != NULL && i < niov; i++) {
        size_t len = iov[i].iov_len, skip = sent < len ? sent : len;
        sent -= skip;
        memcpy(w, (char *)iov[i].iov_base + skip, len - skip);
        w += len - skip;
    }
    give_back(p, l, NULL, 0, 1);
    p->partial++;
    if (rest == NULL)
        l->broken = 1;
    l->back = rest;
    l->nback = rest != NULL ? (size_t)(w - rest) : 0;
}

static void serve(struct pump *p, struct lane *l) {
    ssize_t r = recv(l->efd, p->buf, READ_MAX, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (r <= 0) { /* the end, or an error (its errno kept: the loop's read sees only the end) */
        l->err = r < 0 ? errno : 0;
        give_back(p, l, NULL, 0, 0);
        return;
    }
    struct iovec iov[MAX_CHUNKS + 2];
    long long events;
    int k = steady_read(l, p->buf, (size_t)r, iov, &events);
    if (k == 0) {
        give_back(p, l, p->buf, (size_t)r, 0);
        return;
    }
    char head[24];
    size_t payload = 0;
    for (int i = 1; i <= k; i++)
        payload += iov[i].iov_len;
    int first = 1, niov = k;
    if (l->framed) { /* one chunk, as the Python path writes one read */
        int h = snprintf(head, sizeof head, "%zx\r\n", payload);
        iov[0].iov_base = head;
        iov[0].iov_len = (size_t)h;
        iov[k + 1].iov_base = (void *)"\r\n";
        iov[k + 1].iov_len = 2;
        first = 0;
        niov = k + 2;
    }
    struct msghdr msg = {.msg_iov = iov + first, .msg_iovlen = (size_t)niov};
    ssize_t sent = sendmsg(l->cfd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) { /* nothing went: Python writes it, and meets what the client did */
        give_back(p, l, p->buf, (size_t)r, 0);
        return;
    }
    note(p, l, events);
    p->served++;
    size_t total = payload + (l->framed ? iov[0].iov_len + 2 : 0);
    if ((size_t)sent < total)
        give_back_rest(p, l, iov + first, niov, (size_t)sent);
}

static void *run(void *arg) {
    struct pump *p = arg;
    struct epoll_event evs[64]; /* (signals: blocked since birth, pump_open) */
    for (;;) {
        int n = epoll_wait(p->ep, evs, 64, -1);
        if (n < 0 && errno == EINTR)
            continue;
        int stop = n < 0;
        for (int i = 0; i < n && !stop; i++) { /* the mutex per read: Python waits one at most */
            uint64_t d = evs[i].data.u64;
            uint32_t slot = (uint32_t)d, gen = (uint32_t)(d >> 32);
            pthread_mutex_lock(&p->mu);
            stop = d == STOP_TAG || p->stopping;
            if (!stop && slot < p->cap && p->table[slot] != NULL && p->gens[slot] == gen &&
                p->table[slot]->state == ADOPTED)
                serve(p, p->table[slot]);
            pthread_mutex_unlock(&p->mu);
        }
        pthread_mutex_lock(&p->mu);
        if (stop || p->stopping) { /* every stream still here goes back: none is left unserved */
            for (uint32_t s = 0; s < p->cap; s++)
                if (p->table[s] != NULL && p->table[s]->state == ADOPTED)
                    give_back(p, p->table[s], NULL, 0, 0);
            p->running = 0;
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        pthread_mutex_unlock(&p->mu);
    }
}

void pump_release(struct pump *p, struct lane *l) {
    if (l->state == ADOPTED)
        unhook(p, l);
    else if (l->state == RETURNED)
        for (size_t i = 0; i < p->nqueue; i++)
            if (p->queue[i] == l) {
                p->queue[i] = p->queue[--p->nqueue];
                break;
            }
    if (l->state == ADOPTED || l->state == RETURNED)
        p->table[l->slot] = NULL;
    l->state = IDLE;
}

void pump_taken(struct pump *p, struct lane *l) {
    p->table[l->slot] = NULL;
    l->state = TAKEN;
}

static int grow(struct pump *p) {
    uint32_t cap = p->cap ? p->cap * 2 : 64;
    struct lane **table = realloc(p->table, cap * sizeof *table);
    if (table == NULL)
        return -1;
    p->table = table;
    struct lane **queue = realloc(p->queue, cap * sizeof *queue);
    if (queue == NULL)
        return -1;
    p->queue = queue;
    uint32_t *gens = realloc(p->gens, cap * sizeof *gens);
    if (gens == NULL)
        return -1;
    p->gens = gens;
    for (uint32_t s = p->cap; s < cap; s++) {
        table[s] = NULL;
        gens[s] = 0;
    }
    p->cap = cap;
    return 0;
}

int pump_open(struct pump *p) {
    errno = 0;
    p->buf = malloc(READ_MAX);
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    p->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->stop = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = STOP_TAG};
    if (p->buf == NULL || p->ep < 0 || p->wake < 0 || p->stop < 0 || grow(p) < 0 ||
        epoll_ctl(p->ep, EPOLL_CTL_ADD, p->stop, &ev) < 0)
        return errno ? errno : ENOMEM;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* its frames are small; the buffer is heap */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* born with every signal blocked: the main's */
    p->running = 1;
    int rc = pthread_create(&p->thread, &attr, run, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        p->running = 0;
        return rc;
    }
    p->started = 1;
    return 0;
}

void pump_stop(struct pump *p) {
    if (!p->started)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_mutex_unlock(&p->mu);
    uint64_t one = 1;
    ssize_t w = write(p->stop, &one, sizeof one);
    (void)w;
    pthread_join(p->thread, NULL);
    p->started = 0;
}

void pump_free(struct pump *p) {
    for (int *fd = &p->ep; fd <= &p->stop; fd++)
        if (*fd >= 0)
            close(*fd);
    free(p->table);
    free(p->queue);
    free(p->gens);
    free(p->buf);
    pthread_mutex_destroy(&p->mu);
}

int pump_adopt(struct pump *p, struct lane *l) {
    pthread_mutex_lock(&p->mu);
    uint32_t s = 0;
    while (s < p->cap && p->table[s] != NULL)
        s++;
    int ok = p->running && (s < p->cap || grow(p) == 0);
    if (ok) {
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = ((uint64_t)++p->gens[s] << 32) | s};
        l->slot = s;
        p->table[s] = l;
        l->state = ADOPTED;
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, l->efd, &ev) < 0) {
            p->table[s] = NULL;
            l->state = IDLE;
            ok = 0;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : -1;
}
