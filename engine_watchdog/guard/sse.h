/* The guard's per-event rules, each written once, in C that touches no Python object: the
 * event-stream reader, the token rule and the gap count. The read callback (guard/_relay.c,
 * Progress.feed) and the relay thread (guard/relay_thread.c) both call progress_feed();
 * guard/tokens.py is their Python twin, for where no compiler is, and tests/unit/test_scan_diff.py
 * checks the two against each other, count for count, over random streams and random cuts.
 *
 * The reader follows the WHATWG HTML standard, "Server-sent events", section "Interpreting an
 * event stream": lines end in CRLF, LF or CR (a CRLF cut between two reads is still one line
 * end); a leading U+FEFF is dropped; a line that begins with ':' is a comment; a field's name is
 * what comes before its first ':', and its value what follows, less one leading space; a line
 * without ':' is a field with an empty value; each `data` value is appended to the event's data
 * buffer with an LF between values; an empty line dispatches the event if its data buffer is not
 * empty; an event the stream ends inside is never dispatched.
 *
 * The token rule: an event carries a token when its data holds a generated-content key with a
 * string value that is not empty, read as bytes, never as JSON: the pattern
 *     "(text|content|reasoning_content|reasoning|arguments|delta|partial_json|thinking)"
 *     \s* : \s* " [^"]
 * anywhere in the data (\s as in Python's bytes patterns: space, \t, \n, \r, \f, \v). JSON
 * escapes every quote inside a string, so the pattern can only match a real key. It is searched
 * with an NFA run over the data's bytes as they come: no byte is held, however long the event. */
#ifndef ENGINE_WATCHDOG_SSE_H
#define ENGINE_WATCHDOG_SSE_H

#include <stddef.h>
#include <stdint.h>

#define HIST_MAX 16 /* gap buckets' bounds at most (core/wire.py GAP_BOUNDS has 14) */

/* One stream's reader state (10 bytes): where it is in its line and its event. */
struct sse {
    uint8_t bom;     /* bytes of a leading U+FEFF matched (0..2); 3 once past the start */
    uint8_t cr;      /* the last byte was a CR: an LF now ends no line */
    uint8_t line;    /* where the line is: START, NAME, VALUE0, VALUE, SKIP (sse.c) */
    uint8_t name;    /* bytes of "data" the field name matched, or NAME_OTHER */
    uint8_t fields;  /* a field line came since the last empty line (the event is open) */
    uint8_t data;    /* the event's data buffer is not empty (a data line came) */
    uint8_t carries; /* the event's data holds a token */
    uint8_t keys;    /* the token NFA: keys (a bit each) the open key still matches */
    uint8_t keylen;  /* the token NFA: bytes of the open key read, or KEY_NONE */
    uint8_t after;   /* the token NFA: threads past a key (AFTER_* bits, sse.c) */
};

/* The upper bounds of the gap buckets (core/wire.py GAP_BOUNDS), and one more for the rest. */
struct bounds {
    int n;
    double at[HIST_MAX];
};

/* Gaps between a stream's tokens: counts[i] counts gaps up to bounds.at[i] (bisect_left). */
struct hist {
    long long counts[HIST_MAX + 1];
    double total;
};

/* One stream's progress: its reader, and when its last token passed. */
struct progress {
    struct sse sse;
    int has_last;
    double last_t;
};

/* One piece of a read. */
struct piece {
    const char *at;
    size_t n;
};

void sse_init(struct sse *s);
/* The events that `n` bytes of a stream dispatch which carry a token. */
long long sse_scan(struct sse *s, const char *buf, size_t n);
/* Whether the stream so far ends on an event's boundary: a line of its own written now would
 * begin an event of its own (no line under way, no field since the last empty line). */
int sse_boundary(const struct sse *s);
/* One gap into the histogram. */
void hist_note(struct hist *h, const struct bounds *b, double gap);
/* sse_scan over the pieces of one read, then, where they carried tokens: the gap since the
 * stream's last token into `gaps` (none before its first), and `now` as its last. One gap per
 * read, however many tokens it carried: a read is what the client receives at once. */
long long progress_feed(struct progress *p, const struct bounds *b, struct hist *gaps,
                        const struct piece *pieces, int npieces, double now);

#endif
