/* The relay thread (guard/lanes.py says what it serves and what it hands back; the Python types
 * are guard/_relay.c). This file includes no Python header: nothing here can touch a Python
 * object, so the thread never needs the GIL and never waits on the interpreter. */
#include "relay.h"

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

#define MAX_PIECES 64
#define STOP_TAG UINT64_MAX

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time()'s clock: the guard's default */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- framing: llhttp over each read ---------------------------------------------------- */

/* What llhttp found in one read. */
struct frame {
    struct piece pieces[MAX_PIECES];
    int k;
    int over;     /* more body pieces than fit */
    int in_chunk; /* a chunk's header came and its end did not */
    int ended;    /* the last chunk, or the message's end */
};

static int on_body(llhttp_t *h, const char *at, size_t n) {
    struct frame *f = h->data;
    if (f->k == MAX_PIECES)
        f->over = 1;
    else
        f->pieces[f->k++] = (struct piece){at, n};
    return 0;
}

static int on_chunk_header(llhttp_t *h) {
    struct frame *f = h->data;
    f->in_chunk = 1;
    if (h->content_length == 0)
        f->ended = 1;
    return 0;
}

static int on_chunk_complete(llhttp_t *h) {
    ((struct frame *)h->data)->in_chunk = 0;
    return 0;
}

static int on_message_complete(llhttp_t *h) {
    ((struct frame *)h->data)->ended = 1;
    return 0;
}

static llhttp_settings_t settings;
static const char HEAD[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

/* The lane's parser, between two chunks of a chunked response: where the event loop's
 * (httptools) was when it handed the stream over. 0, or -1 if llhttp refused the head. */
static int parser_at_boundary(struct lane *l) {
    struct frame f = {.k = 0};
    llhttp_init(&l->http, HTTP_RESPONSE, &settings);
    l->http.data = &f;
    llhttp_errno_t e = llhttp_execute(&l->http, HEAD, sizeof HEAD - 1);
    return e == HPE_OK && f.k == 0 && !f.ended ? 0 : -1;
}

/* Whether the read left the parser between two chunks: every chunk it began it ended (llhttp
 * called on_chunk_complete last), and nothing of the next one came: a chunk's size line ends in
 * CRLF, which would have called on_chunk_header, so a read that ends in CRLF after the last
 * chunk's end holds no part of another. */
static int at_boundary(const struct frame *f, const char *buf, size_t n) {
    return !f->in_chunk && !f->ended && !f->over && f->k > 0 && n >= 2 && buf[n - 2] == '\r' &&
           buf[n - 1] == '\n';
}

/* ---- the thread ------------------------------------------------------------------------- */

/* Off epoll, its sockets closed. Its slot stays taken until Python takes the lane (returned()
 * or reclaim): the queue then never holds more lanes than the table has slots. */
static void unhook(struct pump *p, struct lane *l) {
    if (!p->forked) /* (a forked child's epoll is its parent's: never changed from there) */
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

/* The rest of a write the client did not take, handed back for Python to write first. */
static void give_back_rest(struct pump *p, struct lane *l, const struct iovec *iov, int niov,
                           size_t sent) {
    size_t total = 0;
    for (int i = 0; i < niov; i++)
        total += iov[i].iov_len;
    size_t left = sent < total ? total - sent : 0;
    char *rest = left ? malloc(left) : NULL, *w = rest;
    for (int i = 0; rest != NULL && i < niov; i++) {
        size_t len = iov[i].iov_len, skip = sent < len ? sent : len;
        sent -= skip;
        memcpy(w, (const char *)iov[i].iov_base + skip, len - skip);
        w += len - skip;
    }
    give_back(p, l, NULL, 0, 1);
    p->partial++;
    if (rest == NULL && left)
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
    size_t n = (size_t)r;
    struct frame f = {.k = 0};
    l->http.data = &f;
    if (llhttp_execute(&l->http, p->buf, n) != HPE_OK || !at_boundary(&f, p->buf, n)) {
        give_back(p, l, p->buf, n, 0); /* untouched: the loop's parser is where it was */
        return;
    }
    struct iovec iov[MAX_PIECES + 2];
    size_t payload = 0;
    for (int i = 0; i < f.k; i++) {
        iov[1 + i] = (struct iovec){(void *)f.pieces[i].at, f.pieces[i].n};
        payload += f.pieces[i].n;
    }
    char head[24];
    int first = 1, niov = f.k;
    if (l->framed) { /* one chunk, as the Python path writes one read */
        int h = snprintf(head, sizeof head, "%zx\r\n", payload);
        iov[0] = (struct iovec){head, (size_t)h};
        iov[f.k + 1] = (struct iovec){(void *)"\r\n", 2};
        first = 0;
        niov = f.k + 2;
    }
    struct msghdr msg = {.msg_iov = iov + first, .msg_iovlen = (size_t)niov};
    ssize_t sent = sendmsg(l->cfd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) { /* nothing went: Python writes it, and meets what the client did */
        give_back(p, l, p->buf, n, 0);
        return;
    }
    l->events += progress_feed(l->progress, &p->bounds, &l->gaps, f.pieces, f.k, now_s());
    l->reads++;
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

/* ---- fork: the live pumps' mutexes are free in the child, and the child knows it is one --- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pump *live;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Before fork(): every pump's mutex held by the forking thread, so that none is held by a
 * relay thread, which the child will not have. */
static void before_fork(void) {
    pthread_mutex_lock(&live_mu);
    for (struct pump *p = live; p != NULL; p = p->next)
        pthread_mutex_lock(&p->mu);
}

static void after_fork_parent(void) {
    for (struct pump *p = live; p != NULL; p = p->next)
        pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&live_mu);
}

static void after_fork_child(void) {
    for (struct pump *p = live; p != NULL; p = p->next) {
        p->forked = 1;
        p->running = p->started = 0;
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

static void init_once(void) {
    llhttp_settings_init(&settings);
    settings.on_body = on_body;
    settings.on_chunk_header = on_chunk_header;
    settings.on_chunk_complete = on_chunk_complete;
    settings.on_message_complete = on_message_complete;
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- what Python calls (guard/_relay.c) ---------------------------------------------------- */

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
    pthread_once(&once, init_once);
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
    pthread_mutex_lock(&live_mu);
    int rc = pthread_create(&p->thread, &attr, run, p);
    if (rc == 0) {
        p->started = 1;
        p->next = live;
        live = p;
    }
    pthread_mutex_unlock(&live_mu);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        p->running = 0;
    return rc;
}

void pump_stop(struct pump *p) {
    if (!p->started || p->forked)
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
    pthread_mutex_lock(&live_mu);
    for (struct pump **at = &live; *at != NULL; at = &(*at)->next)
        if (*at == p) {
            *at = p->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
    int fds[] = {p->ep, p->wake, p->stop};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0)
            close(fds[i]); /* (a forked child's copies: the parent's stay open) */
    free(p->table);
    free(p->queue);
    free(p->gens);
    free(p->buf);
    pthread_mutex_destroy(&p->mu);
}

int pump_adopt(struct pump *p, struct lane *l) {
    if (parser_at_boundary(l) < 0)
        return -1;
    pthread_mutex_lock(&p->mu);
    uint32_t s = 0;
    while (s < p->cap && p->table[s] != NULL)
        s++;
    int ok = p->running && !p->forked && (s < p->cap || grow(p) == 0);
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
