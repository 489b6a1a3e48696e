/* The guard's read callback, compiled: guard/side.py says what it does and what it leaves to
 * Python. The interpreter costs ~13,000 instructions per relayed event on this path
 * (benchmarks/hot_path.py under callgrind), which is what kept the guard's CPU per event above
 * nginx's (docs/performance.md). The steady event runs here; every other case runs the Python
 * (EngineSide._pass_on, GuardStats.note), and so does every case this code does not recognise.
 *
 * Python must not be entered between the checks and the writes of the steady event except
 * through the calls it makes itself (the client's transport, the clock), as _pass_on does.
 * The fields it reads and writes are __slots__ (Exchange, Scan, GuardStats, Histogram): their
 * places are looked up once per client and used directly, as their member descriptors would;
 * a field that is not such a slot leaves the stream to Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h> /* memmem: pyconfig.h defines _GNU_SOURCE */

#define MAX_BOUNDS 64

static PyObject *parse_errors; /* (HttpParserUpgrade, HttpParserError) */
static PyObject *one;
static PyObject *s_pass_on, *s_parse_failed, *s_hold, *s_transport, *s_ex, *s_stats;
static PyObject *s_framed, *s_clock, *s_high, *s_write, *s_is_closing, *s_buffer_size;
static PyObject *s_scan, *s_gaps, *s_counts, *s_bounds, *s_total, *s_pending, *s_key;
static PyObject *s_last_event_t, *s_events, *s_waiting_since, *s_adopt;

typedef struct {
    PyObject_HEAD
    PyObject *feed;    /* _feed: the parser's feed_data */
    PyObject *ready;   /* _ready: the body pieces of this read */
    PyObject *client;  /* _client: fast.Client, or None before the relay */
    PyObject *failure; /* failure */
    char adopting;     /* _adopting: offer the stream to the steady relay (guard/lanes.py) */
    /* what the steady event needs of _client, read once: */
    PyObject *seen;    /* the _client the fields below are of */
    int fast;          /* 1: they are all there */
    PyObject *write, *is_closing, *buffer_size, *clock, *ex, *scan, *stats, *gaps, *counts;
    /* where the slots are: Exchange's, Scan's, GuardStats', Histogram's */
    Py_ssize_t ex_last, ex_events, ex_since, scan_pending, scan_key, st_last, st_events, g_total;
    int framed;
    Py_ssize_t hint; /* where the key was in the stream's last event (its events keep a shape) */
    Py_ssize_t high, nbounds;
    double bounds[MAX_BOUNDS];
} Side;

static void forget(Side *self) {
    self->fast = 0;
    Py_CLEAR(self->seen);
    Py_CLEAR(self->write);
    Py_CLEAR(self->is_closing);
    Py_CLEAR(self->buffer_size);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->ex);
    Py_CLEAR(self->scan);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->gaps);
    Py_CLEAR(self->counts);
}

static int Side_traverse(Side *self, visitproc visit, void *arg) {
    Py_VISIT(self->feed);
    Py_VISIT(self->ready);
    Py_VISIT(self->client);
    Py_VISIT(self->failure);
    Py_VISIT(self->seen);
    Py_VISIT(self->write);
    Py_VISIT(self->is_closing);
    Py_VISIT(self->buffer_size);
    Py_VISIT(self->clock);
    Py_VISIT(self->ex);
    Py_VISIT(self->scan);
    Py_VISIT(self->stats);
    Py_VISIT(self->gaps);
    Py_VISIT(self->counts);
    return 0;
}

static int Side_clear(Side *self) {
    Py_CLEAR(self->feed);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->client);
    Py_CLEAR(self->failure);
    forget(self);
    return 0;
}

static void Side_dealloc(Side *self) {
    PyObject_GC_UnTrack(self);
    Side_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Reads obj.name into *out (a new reference); 0 if it is missing (the error cleared). */
static int take(PyObject *obj, PyObject *name, PyObject **out) {
    *out = PyObject_GetAttr(obj, name);
    if (*out == NULL) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Where obj's slot `name` is (a writable object member of its type), or 0 if it is none. */
static Py_ssize_t slot_of(PyObject *obj, PyObject *name) {
    PyObject *d = _PyType_Lookup(Py_TYPE(obj), name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0)
        return 0;
    return m->offset;
}

#define SLOT(obj, at) (*(PyObject **)((char *)(obj) + (at)))

/* obj.<slot at> = value (a new reference to value is taken). */
static void put(PyObject *obj, Py_ssize_t at, PyObject *value) {
    PyObject *old = SLOT(obj, at);
    Py_INCREF(value);
    SLOT(obj, at) = value;
    Py_XDECREF(old);
}

/* obj.<slot at> += 1, an int; -1 (error set) if it is not one. */
static int bump(PyObject *obj, Py_ssize_t at) {
    PyObject *old = SLOT(obj, at);
    if (old == NULL || !PyLong_CheckExact(old)) {
        PyErr_SetString(PyExc_TypeError, "Side: a counter is not an int");
        return -1;
    }
    Py_ssize_t n = PyLong_AsSsize_t(old);
    PyObject *new_ = n == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(n + 1);
    if (new_ == NULL)
        return -1;
    SLOT(obj, at) = new_;
    Py_DECREF(old);
    return 0;
}

static int find_slots(Side *self) {
    return (self->ex_last = slot_of(self->ex, s_last_event_t)) &&
           (self->ex_events = slot_of(self->ex, s_events)) &&
           (self->ex_since = slot_of(self->ex, s_waiting_since)) &&
           (self->scan_pending = slot_of(self->scan, s_pending)) &&
           (self->scan_key = slot_of(self->scan, s_key)) &&
           (self->st_last = slot_of(self->stats, s_last_event_t)) &&
           (self->st_events = slot_of(self->stats, s_events)) &&
           (self->g_total = slot_of(self->gaps, s_total));
}

static int read_bounds(Side *self) {
    PyObject *bounds;
    if (!take(self->gaps, s_bounds, &bounds))
        return 0;
    int ok = PyTuple_CheckExact(bounds) && PyTuple_GET_SIZE(bounds) <= MAX_BOUNDS &&
             PyList_CheckExact(self->counts) &&
             PyList_GET_SIZE(self->counts) == PyTuple_GET_SIZE(bounds) + 1;
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(bounds); i++) {
        self->bounds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (self->bounds[i] == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
    }
    self->nbounds = ok ? PyTuple_GET_SIZE(bounds) : 0;
    Py_DECREF(bounds);
    return ok;
}

/* The client's fields the steady event uses, read once per client (Client is plain data set
 * before the relay starts). Anything missing or of another type: the Python path, always. */
static void learn(Side *self) {
    PyObject *c = self->client, *transport = NULL, *framed = NULL, *high = NULL;
    forget(self);
    Py_INCREF(c);
    self->seen = c;
    if (c == Py_None || !take(c, s_stats, &self->stats) || self->stats == Py_None)
        return;
    if (!take(c, s_transport, &transport) || !take(c, s_ex, &self->ex) ||
        !take(c, s_clock, &self->clock) || !take(c, s_framed, &framed) ||
        !take(c, s_high, &high) || !take(transport, s_write, &self->write) ||
        !take(transport, s_is_closing, &self->is_closing) ||
        !take(transport, s_buffer_size, &self->buffer_size) ||
        !take(self->ex, s_scan, &self->scan) || !take(self->stats, s_gaps, &self->gaps) ||
        !take(self->gaps, s_counts, &self->counts) || !PyLong_Check(high) ||
        !read_bounds(self) || !find_slots(self))
        goto done;
    self->framed = PyObject_IsTrue(framed);
    self->high = PyLong_AsSsize_t(high);
    if (self->framed < 0 || (self->high == -1 && PyErr_Occurred()))
        PyErr_Clear();
    else
        self->fast = 1;
done:
    Py_XDECREF(transport);
    Py_XDECREF(framed);
    Py_XDECREF(high);
}

/* Scan.count's hot path, without its fallback: 1 when piece is one whole single-line event with
 * the stream's last token key before a non-empty string, else 0 (Python decides). Scan looks
 * for the key's last place, this for its first: where either is before a non-empty string the
 * event counts in Scan too (its fallback finds the first), so both count the same events. */
static int steady_token(Side *self, PyObject *piece) {
    const char *buf = PyBytes_AS_STRING(piece);
    Py_ssize_t n = PyBytes_GET_SIZE(piece);
    if (n < 2 || buf[n - 1] != '\n' || memchr(buf, '\n', (size_t)n) != buf + n - 2)
        return 0;
    PyObject *pending = SLOT(self->scan, self->scan_pending);
    PyObject *key = SLOT(self->scan, self->scan_key);
    if (pending == NULL || !PyBytes_CheckExact(pending) || PyBytes_GET_SIZE(pending) != 0 ||
        key == NULL || !PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) == 0)
        return 0;
    Py_ssize_t k = PyBytes_GET_SIZE(key), h = self->hint;
    const char *at = buf + h, *want = PyBytes_AS_STRING(key);
    if (h + k >= n || memcmp(at, want, (size_t)k) != 0) {
        at = memmem(buf, (size_t)n, want, (size_t)k);
        if (at == NULL)
            return 0;
        self->hint = at - buf;
    }
    return at + k < buf + n && at[k] != '"';
}

/* GuardStats.note's steady case: the gap since the stream's last token, both counts. */
static int note_gap(Side *self, PyObject *now, double gap) {
    Py_ssize_t i = 0;
    while (i < self->nbounds && self->bounds[i] < gap) /* bisect_left */
        i++;
    PyObject *total = SLOT(self->gaps, self->g_total);
    if (i >= PyList_GET_SIZE(self->counts) || total == NULL || !PyFloat_CheckExact(total)) {
        PyErr_SetString(PyExc_TypeError, "Side: the gap histogram changed shape");
        return -1;
    }
    PyObject *bumped = PyNumber_Add(PyList_GET_ITEM(self->counts, i), one);
    if (bumped == NULL)
        return -1;
    PyList_SetItem(self->counts, i, bumped); /* steals bumped */
    PyObject *sum = PyFloat_FromDouble(PyFloat_AS_DOUBLE(total) + gap);
    if (sum == NULL)
        return -1;
    put(self->gaps, self->g_total, sum);
    Py_DECREF(sum);
    put(self->ex, self->ex_last, now);
    put(self->stats, self->st_last, now);
    if (bump(self->ex, self->ex_events) < 0 || bump(self->stats, self->st_events) < 0)
        return -1;
    return 0;
}

/* The piece as the client gets it: in a chunk of its own where aiohttp chose chunks. */
static PyObject *framed(PyObject *piece) {
    Py_ssize_t n = PyBytes_GET_SIZE(piece), h = 2;
    char head[24], *digit = head + sizeof head - 2; /* "%x\r\n" from the end */
    memcpy(digit, "\r\n", 2);
    size_t rest = (size_t)n;
    do {
        *--digit = "0123456789abcdef"[rest & 15];
        h++;
        rest >>= 4;
    } while (rest);
    PyObject *out = PyBytes_FromStringAndSize(NULL, h + n + 2);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, digit, (size_t)h);
    memcpy(p + h, PyBytes_AS_STRING(piece), (size_t)n);
    memcpy(p + h + n, "\r\n", 2);
    return out;
}

/* After the note: the write, the wait on the engine, the client's buffer (_pass_on's tail). */
static int write_on(Side *self, PyObject *piece, PyObject *now) {
    PyObject *out = self->framed ? framed(piece) : (Py_INCREF(piece), piece);
    if (out == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(self->write, out);
    Py_DECREF(out);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if (SLOT(self->ex, self->ex_since) == Py_None)
        put(self->ex, self->ex_since, now);
    r = PyObject_CallNoArgs(self->buffer_size);
    if (r == NULL)
        return -1;
    Py_ssize_t size = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (size == -1 && PyErr_Occurred())
        return -1;
    if (size > self->high) {
        r = PyObject_CallMethodNoArgs((PyObject *)self, s_hold);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Whether the read was exactly one chunk around the piece: the parser is then between chunks,
 * where the steady relay (guard/_lane.c) takes a stream up. The piece has no CR, so no other
 * framing of the read could have given llhttp this piece. */
static int one_chunk(PyObject *data, PyObject *piece) {
    if (!PyBytes_CheckExact(data))
        return 0;
    const char *d = PyBytes_AS_STRING(data), *p = PyBytes_AS_STRING(piece);
    Py_ssize_t n = PyBytes_GET_SIZE(data), k = PyBytes_GET_SIZE(piece), h = 0;
    while (h < n && h < 9 && ((d[h] >= '0' && d[h] <= '9') || (d[h] >= 'a' && d[h] <= 'f') ||
                              (d[h] >= 'A' && d[h] <= 'F')))
        h++;
    return h > 0 && h < 9 && n == h + 2 + k + 2 && memcmp(d + h, "\r\n", 2) == 0 &&
           memcmp(d + h + 2, p, (size_t)k) == 0 && memcmp(d + n - 2, "\r\n", 2) == 0 &&
           memchr(p, '\r', (size_t)k) == NULL;
}

/* 1: the read was one steady event, passed on; 0: Python's turn (nothing done); -1: error. */
static int steady(Side *self, PyObject *data) {
    if (PyList_GET_SIZE(self->ready) != 1)
        return 0;
    if (self->seen != self->client)
        learn(self);
    PyObject *piece = PyList_GET_ITEM(self->ready, 0);
    if (!self->fast || !PyBytes_CheckExact(piece) || !steady_token(self, piece))
        return 0;
    PyObject *last = SLOT(self->ex, self->ex_last);
    if (last == NULL || !PyFloat_CheckExact(last)) /* the stream's first token: Python's */
        return 0;
    double last_t = PyFloat_AS_DOUBLE(last);
    PyObject *r = PyObject_CallNoArgs(self->is_closing);
    if (r == NULL)
        return -1;
    int closing = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (closing != 0)
        return closing < 0 ? -1 : 0; /* the client went away: Python ends the request */
    PyObject *now = PyObject_CallNoArgs(self->clock);
    if (now == NULL)
        return -1;
    if (!PyFloat_CheckExact(now)) {
        Py_DECREF(now);
        return 0;
    }
    Py_INCREF(piece);
    int rc = PyList_SetSlice(self->ready, 0, 1, NULL); /* ready.clear() */
    if (rc == 0)
        rc = note_gap(self, now, PyFloat_AS_DOUBLE(now) - last_t);
    if (rc == 0)
        rc = write_on(self, piece, now);
    if (rc == 0 && self->adopting && one_chunk(data, piece)) {
        r = PyObject_CallMethodNoArgs((PyObject *)self, s_adopt);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(piece);
    Py_DECREF(now);
    return rc < 0 ? -1 : 1;
}

static PyObject *call_method_one(PyObject *self, PyObject *name, PyObject *arg) {
    PyObject *args[2] = {self, arg};
    return PyObject_VectorcallMethod(name, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *Side_data_received(Side *self, PyObject *data) {
    if (self->feed == NULL || self->ready == NULL || !PyList_CheckExact(self->ready)) {
        PyErr_SetString(PyExc_RuntimeError, "Side: _feed and _ready are not set");
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(self->feed, data);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(parse_errors))
            return NULL;
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
#else
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
#endif
        r = call_method_one((PyObject *)self, s_parse_failed, exc);
        Py_XDECREF(exc);
        if (r == NULL)
            return NULL;
    }
    Py_DECREF(r);
    if (PyList_GET_SIZE(self->ready) == 0 || self->client == NULL || self->client == Py_None ||
        (self->failure != NULL && self->failure != Py_None))
        Py_RETURN_NONE;
    int done = steady(self, data);
    if (done < 0)
        return NULL;
    if (done)
        Py_RETURN_NONE;
    return PyObject_CallMethodNoArgs((PyObject *)self, s_pass_on);
}

static PyMethodDef Side_methods[] = {
    {"data_received", (PyCFunction)Side_data_received, METH_O,
     "Feed one read to the parser and pass its body on (guard/side.py)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Side_members[] = {
    {"_feed", T_OBJECT, offsetof(Side, feed), 0, "The response parser's feed_data."},
    {"_ready", T_OBJECT, offsetof(Side, ready), 0, "Body pieces not yet passed on."},
    {"_client", T_OBJECT, offsetof(Side, client), 0, "Where the body goes, once relayed."},
    {"failure", T_OBJECT, offsetof(Side, failure), 0, "What ended the exchange, or None."},
    {"_adopting", T_BOOL, offsetof(Side, adopting), 0, "Offer the stream to the relay thread."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SideType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "engine_watchdog.guard._side.Side",
    .tp_doc = "The engine connection's read callback, compiled (guard/side.py).",
    .tp_basicsize = sizeof(Side),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Side_dealloc,
    .tp_traverse = (traverseproc)Side_traverse,
    .tp_clear = (inquiry)Side_clear,
    .tp_methods = Side_methods,
    .tp_members = Side_members,
};

static int intern_all(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_pass_on, "_pass_on"}, {&s_parse_failed, "_parse_failed"}, {&s_hold, "_hold"},
        {&s_transport, "transport"}, {&s_ex, "ex"}, {&s_stats, "stats"},
        {&s_framed, "framed"}, {&s_clock, "clock"}, {&s_high, "high"}, {&s_write, "write"},
        {&s_is_closing, "is_closing"}, {&s_buffer_size, "get_write_buffer_size"},
        {&s_scan, "scan"}, {&s_gaps, "gaps"}, {&s_counts, "counts"}, {&s_bounds, "bounds"},
        {&s_total, "total"}, {&s_pending, "pending"}, {&s_key, "key"},
        {&s_last_event_t, "last_event_t"}, {&s_events, "events"},
        {&s_waiting_since, "waiting_since"}, {&s_adopt, "_adopt"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return -1;
    }
    return 0;
}

static struct PyModuleDef side_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "engine_watchdog.guard._side",
    .m_doc = "The guard's read callback, compiled (guard/side.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__side(void) {
    one = PyLong_FromLong(1);
    if (one == NULL || PyType_Ready(&SideType) < 0 || intern_all() < 0)
        return NULL;
    PyObject *httptools = PyImport_ImportModule("httptools");
    if (httptools == NULL)
        return NULL;
    PyObject *upgrade = PyObject_GetAttrString(httptools, "HttpParserUpgrade");
    PyObject *error = PyObject_GetAttrString(httptools, "HttpParserError");
    Py_DECREF(httptools);
    if (upgrade == NULL || error == NULL) {
        Py_XDECREF(upgrade);
        Py_XDECREF(error);
        return NULL;
    }
    parse_errors = PyTuple_Pack(2, upgrade, error);
    Py_DECREF(upgrade);
    Py_DECREF(error);
    if (parse_errors == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&side_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SideType);
    if (PyModule_AddObject(m, "Side", (PyObject *)&SideType) < 0) {
        Py_DECREF(&SideType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
