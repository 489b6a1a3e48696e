/* The steady relay: a thread of its own that carries a stream's steady events from the engine's
 * socket to the client's, without the interpreter and without the event loop (guard/lanes.py
 * says when a stream is handed over, and what comes back).
 *
 * Why: with the read callback compiled (_side.c), what kept the guard's CPU per event above
 * nginx's was the event loop's own cost per read (a Python callback, a bytes object, the
 * dispatch): a bare byte relay on uvloop costs what nginx costs (docs/performance.md).
 *
 * The contract, which keeps the Python path the one authority:
 *  - A lane serves a read only if the whole read is whole HTTP chunks, each of whole single-line
 *    SSE events that carry the stream's token key before a non-empty string (what guard/_side.c
 *    calls a steady event). It then writes them to the client as one chunk, as the Python path
 *    writes one read, and counts them as GuardStats.note does (one gap per read).
 *  - Any other read is handed back untouched, with the stream: Python feeds it to the stream's
 *    parser, whose state is the one it left, since a lane consumes only whole chunks. So is an
 *    end of stream, an error, or a client that takes less than the whole write (the rest is
 *    handed back for Python to write first).
 *  - The lane owns duplicates of both sockets, so a descriptor the event loop closes is never
 *    reused under it; Python takes a stream back (reclaim) before it writes to its client or
 *    closes its engine connection, and the mutex makes that wait for a read in progress.
 *  - The thread never touches a Python object: counts wait in the lane until Python takes them
 *    (take(), at each probe round, scrape and hand-back). Its code is guard/_lane_thread.c,
 *    which includes no Python header; this file is the Python types around it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "lane.h"

typedef struct {
    PyObject_HEAD
    PyObject *owner; /* Python's side of the stream */
    PyObject *pump;  /* the Pump it was adopted by */
    struct lane c;   /* what the thread reads and writes */
} Lane;

typedef struct {
    PyObject_HEAD
    struct pump c;
} Pump;

static PyTypeObject LaneType, PumpType;

#define LANE_OF(c_) ((Lane *)((char *)(c_) - offsetof(Lane, c)))

static PyObject *Pump_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *bounds;
    static char *names[] = {"bounds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, &PyTuple_Type, &bounds))
        return NULL;
    if (PyTuple_GET_SIZE(bounds) > MAX_BOUNDS)
        return PyErr_Format(PyExc_ValueError, "Pump: over %d bounds", MAX_BOUNDS);
    Pump *p = (Pump *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    p->c.ep = p->c.wake = p->c.stop = -1; /* (not 0: dealloc would close stdin) */
    pthread_mutex_init(&p->c.mu, NULL);
    p->c.nbounds = (int)PyTuple_GET_SIZE(bounds);
    for (int i = 0; i < p->c.nbounds; i++) {
        p->c.bounds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (p->c.bounds[i] == -1.0 && PyErr_Occurred()) {
            p->c.nbounds = 0;
            break;
        }
    }
    int rc = PyErr_Occurred() ? 0 : pump_open(&p->c);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    if (PyErr_Occurred()) {
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
    pump_stop(&p->c); /* (no lane is left: each holds its pump) */
    pump_free(&p->c);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int dup_of(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

/* adopt(owner, engine_fd, client_fd, key, framed, last_t): the stream's steady reads are the
 * thread's from now on; its Lane, or None where the thread has stopped. */
static PyObject *Pump_adopt(Pump *p, PyObject *args) {
    PyObject *owner;
    int efd, cfd, framed;
    const char *key;
    Py_ssize_t klen;
    double last_t;
    if (!PyArg_ParseTuple(args, "Oiiy#pd", &owner, &efd, &cfd, &key, &klen, &framed, &last_t))
        return NULL;
    if (klen <= 0 || klen > MAX_KEY)
        return PyErr_Format(PyExc_ValueError, "adopt: a key of 1 to %d bytes", MAX_KEY);
    Lane *l = PyObject_GC_New(Lane, &LaneType);
    if (l == NULL)
        return NULL;
    memset(&l->c, 0, sizeof l->c);
    memcpy(l->c.key, key, (size_t)klen);
    l->c.klen = (size_t)klen;
    l->c.framed = framed;
    l->c.last_t = last_t;
    l->c.efd = dup_of(efd);
    l->c.cfd = l->c.efd >= 0 ? dup_of(cfd) : -1;
    Py_INCREF(owner);
    l->owner = owner;
    Py_INCREF(p);
    l->pump = (PyObject *)p;
    PyObject_GC_Track(l);
    if (l->c.cfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(l); /* (dealloc closes the one it has) */
        return NULL;
    }
    if (pump_adopt(&p->c, &l->c) < 0) {
        Py_DECREF(l);
        Py_RETURN_NONE;
    }
    return (PyObject *)l;
}

/* The lanes the thread handed back since the last call (clears the wake-up). */
static PyObject *Pump_returned(Pump *p, PyObject *unused) {
    (void)unused;
    uint64_t n;
    ssize_t r = read(p->c.wake, &n, sizeof n);
    (void)r;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
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

/* take(): (events, last_t, gap counts, gap sum) counted since the last take, zeroed. */
static PyObject *Lane_take(Lane *l, PyObject *unused) {
    (void)unused;
    struct pump *p = &((Pump *)l->pump)->c;
    long long gaps[MAX_BOUNDS + 1];
    pthread_mutex_lock(&p->mu);
    long long events = l->c.events;
    double last_t = l->c.last_t, total = l->c.gap_total;
    int nb = p->nbounds;
    memcpy(gaps, l->c.gaps, sizeof gaps);
    memset(l->c.gaps, 0, sizeof l->c.gaps);
    l->c.events = 0;
    l->c.gap_total = 0.0;
    pthread_mutex_unlock(&p->mu);
    PyObject *counts = PyTuple_New(nb + 1);
    for (int i = 0; counts != NULL && i <= nb; i++) {
        PyObject *c = PyLong_FromLongLong(gaps[i]);
        if (c == NULL) {
            Py_CLEAR(counts);
            break;
        }
        PyTuple_SET_ITEM(counts, i, c);
    }
    if (counts == NULL)
        return NULL;
    return Py_BuildValue("(LdNd)", events, last_t, counts, total);
}

/* reclaim(): the stream is Python's again (waits for a read in progress); what was handed
 * back with it, as (bytes, unsent, errno of a failed read or 0). */
static PyObject *Lane_reclaim(Lane *l, PyObject *unused) {
    (void)unused;
    struct pump *p = &((Pump *)l->pump)->c;
    pthread_mutex_lock(&p->mu);
    pump_release(p, &l->c);
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

static int Lane_traverse(Lane *l, visitproc visit, void *arg) {
    Py_VISIT(l->owner);
    Py_VISIT(l->pump);
    return 0;
}

static int Lane_clear(Lane *l) {
    Py_CLEAR(l->owner);
    return 0;
}

static void Lane_dealloc(Lane *l) {
    PyObject_GC_UnTrack(l);
    if (l->pump != NULL) { /* (the thread may be reading it: the mutex) */
        struct pump *p = &((Pump *)l->pump)->c;
        pthread_mutex_lock(&p->mu);
        pump_release(p, &l->c);
        pthread_mutex_unlock(&p->mu);
    }
    if (l->c.efd >= 0) /* never adopted: its duplicates are still open */
        close(l->c.efd);
    if (l->c.cfd >= 0)
        close(l->c.cfd);
    free(l->c.back);
    Py_CLEAR(l->owner);
    Py_CLEAR(l->pump);
    PyObject_GC_Del(l);
}

static PyMethodDef Lane_methods[] = {
    {"take", (PyCFunction)Lane_take, METH_NOARGS, "Counts since the last take, zeroed."},
    {"reclaim", (PyCFunction)Lane_reclaim, METH_NOARGS, "The stream back; what came with it."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Lane_members[] = {
    {"owner", T_OBJECT, offsetof(Lane, owner), READONLY, "The stream's Python side."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "engine_watchdog.guard._lane.Lane",
    .tp_doc = "One stream on the steady relay (guard/lanes.py).",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_methods = Lane_methods,
    .tp_members = Lane_members,
};

static PyMethodDef Pump_methods[] = {
    {"adopt", (PyCFunction)Pump_adopt, METH_VARARGS, "Hand a steady stream to the thread."},
    {"returned", (PyCFunction)Pump_returned, METH_NOARGS, "The lanes handed back."},
    {"fileno", (PyCFunction)Pump_fileno, METH_NOARGS, "Readable when lanes come back."},
    {"counts", (PyCFunction)Pump_counts, METH_NOARGS, "(reads served, hand-backs, of them part-written, running)."},
    {"close", (PyCFunction)Pump_close, METH_NOARGS, "Stop the thread; its lanes come back."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "engine_watchdog.guard._lane.Pump",
    .tp_doc = "The steady relay's thread (guard/lanes.py).",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Pump_new,
    .tp_dealloc = (destructor)Pump_dealloc,
    .tp_methods = Pump_methods,
};

static struct PyModuleDef lane_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "engine_watchdog.guard._lane",
    .m_doc = "The guard's steady relay, a thread of its own (guard/lanes.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__lane(void) {
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&PumpType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&lane_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LaneType);
    Py_INCREF(&PumpType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0 ||
        PyModule_AddObject(m, "Pump", (PyObject *)&PumpType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
