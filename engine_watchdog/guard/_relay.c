/* The guard's compiled path, as Python types (guard/scan.py and guard/lanes.py use them):
 *  - Hist: the guard's histogram of gaps between tokens;
 *  - Progress: one stream's progress, fed every read the event loop relays (its reader and
 *    token rule, guard/sse.c);
 *  - Pump and Lane: the relay thread (guard/relay_thread.c), which carries a stream's reads from
 *    the engine's socket to the client's without the interpreter, advancing the same Progress,
 *    and hands the stream back at the first read it does not serve.
 *
 * The contract that keeps the event loop's path the one authority:
 *  - A lane serves a read only if llhttp finds it whole chunks of the response (guard/relay.h:
 *    adopted at a chunk boundary, it stays at one); it then writes their data to the client as
 *    one chunk, as the loop writes one read, and feeds it to the stream's Progress as the loop
 *    does (guard/sse.c progress_feed: any event-stream shape, every token counted).
 *  - Any other read is handed back untouched, with the stream: the loop's parser (httptools)
 *    is where the stream left it. So is an end of stream, an error, or a client that takes less
 *    than the whole write (the rest is handed back for Python to write first).
 *  - The lane owns duplicates of both sockets, so a descriptor the event loop closes is never
 *    reused under it; Python takes a stream back (reclaim) before it writes to its client or
 *    closes its engine connection, and the mutex makes that wait for a read in progress.
 *  - The thread never touches a Python object: counts wait in the lane until Python takes them.
 *
 * CPython: the limited API (3.10) only, multi-phase initialisation, heap types, no object's
 * fields written from C. A Progress and the Hist are touched with the GIL held, or by the thread
 * while a lane holds the stream (Python does not feed an adopted stream; reclaim comes first).
 * On a free-threaded Python this module is not built (the limited API is not offered there)
 * and guard/tokens.py runs instead. Across fork(): relay_thread.c's handlers make the child's
 * copies inert (guard/lanes.py). */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay.h"

typedef struct {
    PyTypeObject *hist, *progress, *pump, *lane;
} State;

typedef struct {
    PyObject_HEAD
    struct bounds bounds;
    struct hist c;
} Hist;

typedef struct {
    PyObject_HEAD
    PyObject *hist; /* the guard's Hist, where the loop's reads count their gaps */
    struct progress c;
    int adopted; /* a lane holds it: the thread's (set and cleared with the GIL held) */
} Progress;

typedef struct {
    PyObject_HEAD
    PyObject *hist; /* where a lane's gaps go when Python takes them */
    struct pump c;
} Pump;

typedef struct {
    PyObject_HEAD
    PyObject *owner;    /* Python's side of the stream */
    PyObject *pump;     /* the Pump it was adopted by */
    PyObject *progress; /* the stream's Progress, advanced by the thread meanwhile */
    int holds;          /* this lane holds the Progress (adopt, until release) */
    struct lane c;      /* what the thread reads and writes */
} Lane;

#define LANE_OF(c_) ((Lane *)((char *)(c_) - offsetof(Lane, c)))

static State *state_of(PyTypeObject *type) { return PyType_GetModuleState(type); }

static void dealloc_base(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type);
}

/* ---- Hist -------------------------------------------------------------------------------- */

static int read_bounds(PyObject *tuple, struct bounds *b) {
    if (!PyTuple_Check(tuple) || PyTuple_Size(tuple) > HIST_MAX) {
        PyErr_Format(PyExc_ValueError, "bounds: a tuple of at most %d floats", HIST_MAX);
        return -1;
    }
    b->n = (int)PyTuple_Size(tuple);
    for (int i = 0; i < b->n; i++) {
        b->at[i] = PyFloat_AsDouble(PyTuple_GetItem(tuple, i));
        if (b->at[i] == -1.0 && PyErr_Occurred())
            return -1;
        if (i > 0 && !(b->at[i] > b->at[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "bounds: increasing");
            return -1;
        }
    }
    return 0;
}

static PyObject *Hist_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *bounds;
    static char *names[] = {"bounds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O", names, &bounds))
        return NULL;
    Hist *h = (Hist *)PyType_GenericAlloc(type, 0);
    if (h == NULL)
        return NULL;
    if (read_bounds(bounds, &h->bounds) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static PyObject *counts_of(const struct hist *c, int n) {
    PyObject *counts = PyTuple_New(n + 1);
    for (int i = 0; counts != NULL && i <= n; i++) {
        PyObject *v = PyLong_FromLongLong(c->counts[i]);
        if (v == NULL || PyTuple_SetItem(counts, i, v) < 0)
            Py_CLEAR(counts);
    }
    return counts;
}

/* snapshot(): (counts, total). */
static PyObject *Hist_snapshot(Hist *h, PyObject *unused) {
    (void)unused;
    PyObject *counts = counts_of(&h->c, h->bounds.n);
    return counts == NULL ? NULL : Py_BuildValue("(Nd)", counts, h->c.total);
}

static PyObject *Hist_note(Hist *h, PyObject *gap) {
    double g = PyFloat_AsDouble(gap);
    if (g == -1.0 && PyErr_Occurred())
        return NULL;
    hist_note(&h->c, &h->bounds, g);
    Py_RETURN_NONE;
}

static PyObject *Hist_bounds(Hist *h, void *unused) {
    (void)unused;
    PyObject *out = PyTuple_New(h->bounds.n);
    for (int i = 0; out != NULL && i < h->bounds.n; i++) {
        PyObject *v = PyFloat_FromDouble(h->bounds.at[i]);
        if (v == NULL || PyTuple_SetItem(out, i, v) < 0)
            Py_CLEAR(out);
    }
    return out;
}

static PyMethodDef Hist_methods[] = {
    {"snapshot", (PyCFunction)Hist_snapshot, METH_NOARGS, "(counts, total)."},
    {"note", (PyCFunction)Hist_note, METH_O, "One gap."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Hist_getset[] = {
    {"bounds", (getter)Hist_bounds, NULL, "The buckets' upper bounds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Hist_slots[] = {
    {Py_tp_doc, "Gaps between a stream's tokens, of every stream (guard/sse.h)."},
    {Py_tp_new, Hist_new},
    {Py_tp_dealloc, dealloc_base},
    {Py_tp_methods, Hist_methods},
    {Py_tp_getset, Hist_getset},
    {0, NULL},
};

static PyType_Spec Hist_spec = {
    "engine_watchdog.guard._relay.Hist", sizeof(Hist), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Hist_slots,
};

/* ---- Progress ------------------------------------------------------------------------------- */

static PyObject *Progress_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *hist;
    static char *names[] = {"gaps", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, state_of(type)->hist, &hist))
        return NULL;
    Progress *p = (Progress *)PyType_GenericAlloc(type, 0);
    if (p == NULL)
        return NULL;
    Py_INCREF(hist);
    p->hist = hist;
    sse_init(&p->c.sse);
    return (PyObject *)p;
}

/* feed(data, now): the tokens the read carried (guard/sse.c progress_feed). */
static PyObject *Progress_feed(Progress *p, PyObject *args) {
    const char *data;
    Py_ssize_t n;
    double now;
    if (!PyArg_ParseTuple(args, "y#d", &data, &n, &now))
        return NULL;
    if (p->adopted) {
        PyErr_SetString(PyExc_RuntimeError, "Progress: fed while the relay thread holds it");
        return NULL;
    }
    Hist *h = (Hist *)p->hist;
    struct piece one = {data, (size_t)n};
    return PyLong_FromLongLong(progress_feed(&p->c, &h->bounds, &h->c, &one, 1, now));
}

static PyObject *Progress_boundary(Progress *p, void *unused) {
    (void)unused;
    return PyBool_FromLong(!p->adopted && sse_boundary(&p->c.sse));
}

static int Progress_traverse(Progress *p, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(p));
    Py_VISIT(p->hist);
    return 0;
}

static void Progress_dealloc(Progress *p) {
    PyObject_GC_UnTrack(p);
    Py_CLEAR(p->hist);
    dealloc_base((PyObject *)p);
}

static PyMethodDef Progress_methods[] = {
    {"feed", (PyCFunction)Progress_feed, METH_VARARGS, "The tokens one read carried."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Progress_getset[] = {
    {"boundary", (getter)Progress_boundary, NULL,
     "The stream so far ends on an event's boundary.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Progress_slots[] = {
    {Py_tp_doc, "One stream's progress: its event-stream reader and token rule (guard/sse.h)."},
    {Py_tp_new, Progress_new},
    {Py_tp_dealloc, Progress_dealloc},
    {Py_tp_traverse, Progress_traverse},
    {Py_tp_methods, Progress_methods},
    {Py_tp_getset, Progress_getset},
    {0, NULL},
};

static PyType_Spec Progress_spec = {
    "engine_watchdog.guard._relay.Progress", sizeof(Progress), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, Progress_slots,
};

/* ---- Pump ---------------------------------------------------------------------------------- */

static PyObject *Pump_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *hist;
    static char *names[] = {"gaps", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, state_of(type)->hist, &hist))
        return NULL;
    Pump *p = (Pump *)PyType_GenericAlloc(type, 0);
    if (p == NULL)
        return NULL;
    p->c.ep = p->c.wake = p->c.stop = -1; /* (not 0: dealloc would close stdin) */
    pthread_mutex_init(&p->c.mu, NULL);
    Py_INCREF(hist);
    p->hist = hist;
    p->c.bounds = ((Hist *)hist)->bounds;
    int rc = pump_open(&p->c);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

/* Stop the thread: every lane still adopted is handed back (take them with returned()). */
static PyObject *Pump_close(Pump *p, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    pump_stop(&p->c);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void Pump_dealloc(Pump *p) {
    Py_BEGIN_ALLOW_THREADS /* (no lane is left: each holds its pump; the thread holds no GIL) */
    pump_stop(&p->c);
    Py_END_ALLOW_THREADS
    pump_free(&p->c);
    Py_CLEAR(p->hist);
    dealloc_base((PyObject *)p);
}

static int dup_of(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

static void Lane_dealloc(Lane *l);

/* adopt(owner, progress, engine_fd, client_fd, framed): the stream's reads are the thread's
 * from now on; its Lane, or None where the thread has stopped or cannot take it. */
static PyObject *Pump_adopt(Pump *p, PyObject *args) {
    State *st = state_of(Py_TYPE(p));
    PyObject *owner, *progress;
    int efd, cfd, framed;
    if (!PyArg_ParseTuple(args, "OO!iip", &owner, st->progress, &progress, &efd, &cfd, &framed))
        return NULL;
    Progress *pr = (Progress *)progress;
    if (pr->adopted || ((Progress *)progress)->hist != p->hist) {
        PyErr_SetString(PyExc_ValueError, "adopt: a stream adopted already, or another guard's");
        return NULL;
    }
    if (p->c.forked)
        Py_RETURN_NONE;
    Lane *l = (Lane *)PyType_GenericAlloc(st->lane, 0);
    if (l == NULL)
        return NULL;
    memset(&l->c, 0, sizeof l->c);
    l->c.framed = framed;
    l->c.efd = dup_of(efd);
    l->c.cfd = l->c.efd >= 0 ? dup_of(cfd) : -1;
    Py_INCREF(owner);
    l->owner = owner;
    Py_INCREF(p);
    l->pump = (PyObject *)p;
    if (l->c.cfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(l); /* (dealloc closes the one it has) */
        return NULL;
    }
    Py_INCREF(progress);
    l->progress = progress;
    l->c.progress = &pr->c;
    pr->adopted = l->holds = 1; /* before the thread can see it: pump_adopt publishes it */
    if (pump_adopt(&p->c, &l->c) < 0) {
        Py_DECREF(l); /* (dealloc clears adopted) */
        Py_RETURN_NONE;
    }
    return (PyObject *)l;
}

/* The lanes the thread handed back since the last call (clears the wake-up). */
static PyObject *Pump_returned(Pump *p, PyObject *unused) {
    (void)unused;
    PyObject *out = PyList_New(0);
    if (out == NULL || p->c.forked) /* (the wake-up is the parent's to clear) */
        return out;
    uint64_t n;
    ssize_t r = read(p->c.wake, &n, sizeof n);
    (void)r;
    pthread_mutex_lock(&p->c.mu);
    size_t kept = 0;
    for (size_t i = 0; i < p->c.nqueue; i++)
        if (PyList_Append(out, (PyObject *)LANE_OF(p->c.queue[i])) == 0)
            pump_taken(&p->c, p->c.queue[i]);
        else
            p->c.queue[kept++] = p->c.queue[i]; /* RETURNED still: the next call, or reclaim */
    p->c.nqueue = kept;
    pthread_mutex_unlock(&p->c.mu);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *Pump_fileno(Pump *p, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(p->c.wake);
}

static PyObject *Pump_counts(Pump *p, PyObject *unused) {
    (void)unused;
    pthread_mutex_lock(&p->c.mu);
    long long served = p->c.served, back = p->c.handed_back, partial = p->c.partial;
    int running = p->c.running;
    pthread_mutex_unlock(&p->c.mu);
    return Py_BuildValue("(LLLO)", served, back, partial, running ? Py_True : Py_False);
}

static PyMethodDef Pump_methods[] = {
    {"adopt", (PyCFunction)Pump_adopt, METH_VARARGS, "Hand a stream to the thread."},
    {"returned", (PyCFunction)Pump_returned, METH_NOARGS, "The lanes handed back."},
    {"fileno", (PyCFunction)Pump_fileno, METH_NOARGS, "Readable when lanes come back."},
    {"counts", (PyCFunction)Pump_counts, METH_NOARGS,
     "(reads served, hand-backs, of them part-written, running)."},
    {"close", (PyCFunction)Pump_close, METH_NOARGS, "Stop the thread; its lanes come back."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Pump_slots[] = {
    {Py_tp_doc, "The relay thread (guard/lanes.py)."},
    {Py_tp_new, Pump_new},
    {Py_tp_dealloc, Pump_dealloc},
    {Py_tp_methods, Pump_methods},
    {0, NULL},
};

static PyType_Spec Pump_spec = {
    "engine_watchdog.guard._relay.Pump", sizeof(Pump), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Pump_slots,
};

/* ---- Lane ---------------------------------------------------------------------------------- */

/* take(): (tokens, last token's time, reads served) since the last take, zeroed; its gaps
 * into the guard's Hist. */
static PyObject *Lane_take(Lane *l, PyObject *unused) {
    (void)unused;
    Pump *pump = (Pump *)l->pump;
    struct pump *p = &pump->c;
    pthread_mutex_lock(&p->mu);
    long long events = l->c.events, reads = l->c.reads;
    double last_t = l->c.progress->last_t;
    int has_last = l->c.progress->has_last;
    struct hist gaps = l->c.gaps;
    memset(&l->c.gaps, 0, sizeof l->c.gaps);
    l->c.events = l->c.reads = 0;
    pthread_mutex_unlock(&p->mu);
    Hist *h = (Hist *)pump->hist; /* (the GIL: the loop's reads count there too) */
    for (int i = 0; i <= p->bounds.n; i++)
        h->c.counts[i] += gaps.counts[i];
    h->c.total += gaps.total;
    if (!has_last)
        return Py_BuildValue("(LOL)", events, Py_None, reads);
    return Py_BuildValue("(LdL)", events, last_t, reads);
}

/* The mutex held by the caller: the stream is Python's again. */
static void release(Lane *l) {
    pump_release(&((Pump *)l->pump)->c, &l->c);
    if (l->holds) /* (a later lane may hold the same Progress: only its own flag is cleared) */
        ((Progress *)l->progress)->adopted = 0;
    l->holds = 0;
}

/* reclaim(): the stream is Python's again (waits for a read in progress); what was handed
 * back with it, as (bytes, unsent, errno of a failed read or 0). */
static PyObject *Lane_reclaim(Lane *l, PyObject *unused) {
    (void)unused;
    struct pump *p = &((Pump *)l->pump)->c;
    pthread_mutex_lock(&p->mu);
    release(l);
    char *back = l->c.back;
    size_t n = l->c.nback;
    int unsent = l->c.unsent, broken = l->c.broken, err = l->c.err;
    l->c.back = NULL;
    l->c.nback = 0;
    pthread_mutex_unlock(&p->mu);
    if (broken) {
        free(back);
        return PyErr_NoMemory();
    }
    PyObject *out = Py_BuildValue("(y#Oi)", back != NULL ? back : "", (Py_ssize_t)n,
                                  unsent ? Py_True : Py_False, err);
    free(back);
    return out;
}

static PyObject *Lane_owner(Lane *l, void *unused) {
    (void)unused;
    PyObject *owner = l->owner != NULL ? l->owner : Py_None;
    Py_INCREF(owner);
    return owner;
}

static int Lane_traverse(Lane *l, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(l));
    Py_VISIT(l->owner);
    Py_VISIT(l->pump);
    Py_VISIT(l->progress);
    return 0;
}

/* Only the owner: the pump and the progress stay until the lane is gone (the thread may be
 * using them, and neither refers back to a lane). */
static int Lane_clear(Lane *l) {
    Py_CLEAR(l->owner);
    return 0;
}

static void Lane_dealloc(Lane *l) {
    PyObject_GC_UnTrack(l);
    if (l->pump != NULL && l->progress != NULL) { /* (the thread may be reading it: the mutex) */
        struct pump *p = &((Pump *)l->pump)->c;
        pthread_mutex_lock(&p->mu);
        release(l);
        pthread_mutex_unlock(&p->mu);
    }
    if (l->c.efd >= 0) /* never adopted: its duplicates are still open */
        close(l->c.efd);
    if (l->c.cfd >= 0)
        close(l->c.cfd);
    free(l->c.back);
    Py_CLEAR(l->owner);
    Py_CLEAR(l->progress);
    Py_CLEAR(l->pump);
    PyTypeObject *type = Py_TYPE(l);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(l);
    Py_DECREF(type);
}

static PyMethodDef Lane_methods[] = {
    {"take", (PyCFunction)Lane_take, METH_NOARGS, "Counts since the last take, zeroed."},
    {"reclaim", (PyCFunction)Lane_reclaim, METH_NOARGS, "The stream back; what came with it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lane_getset[] = {
    {"owner", (getter)Lane_owner, NULL, "The stream's Python side.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Lane_slots[] = {
    {Py_tp_doc, "One stream on the relay thread (guard/lanes.py)."},
    {Py_tp_dealloc, Lane_dealloc},
    {Py_tp_traverse, Lane_traverse},
    {Py_tp_clear, Lane_clear},
    {Py_tp_methods, Lane_methods},
    {Py_tp_getset, Lane_getset},
    {0, NULL},
};

static PyType_Spec Lane_spec = {
    "engine_watchdog.guard._relay.Lane", sizeof(Lane), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
        Py_TPFLAGS_DISALLOW_INSTANTIATION,
    Lane_slots,
};

/* ---- the module --------------------------------------------------------------------------- */

static int add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **out) {
    *out = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    if (*out == NULL)
        return -1;
    const char *dot = strrchr(spec->name, '.');
    return PyModule_AddObjectRef(m, dot + 1, (PyObject *)*out);
}

static int exec_module(PyObject *m) {
    State *st = PyModule_GetState(m);
    if (add_type(m, &Hist_spec, &st->hist) < 0 || add_type(m, &Progress_spec, &st->progress) < 0 ||
        add_type(m, &Pump_spec, &st->pump) < 0 || add_type(m, &Lane_spec, &st->lane) < 0)
        return -1;
    return 0;
}

static int traverse_module(PyObject *m, visitproc visit, void *arg) {
    State *st = PyModule_GetState(m);
    if (st != NULL) {
        Py_VISIT(st->hist);
        Py_VISIT(st->progress);
        Py_VISIT(st->pump);
        Py_VISIT(st->lane);
    }
    return 0;
}

static int clear_module(PyObject *m) {
    State *st = PyModule_GetState(m);
    if (st != NULL) {
        Py_CLEAR(st->hist);
        Py_CLEAR(st->progress);
        Py_CLEAR(st->pump);
        Py_CLEAR(st->lane);
    }
    return 0;
}

static void free_module(void *m) { clear_module((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef relay_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "engine_watchdog.guard._relay",
    .m_doc = "The guard's compiled path: progress of a stream, and the relay thread.",
    .m_size = sizeof(State),
    .m_slots = module_slots,
    .m_traverse = traverse_module,
    .m_clear = clear_module,
    .m_free = free_module,
};

PyMODINIT_FUNC PyInit__relay(void) { return PyModuleDef_Init(&relay_module); }
