/* The guard's per-event rules (sse.h says what they are). No Python header: the relay thread
 * runs this without the GIL. */
#include "sse.h"

#include <string.h>

enum { START, NAME, VALUE0, VALUE, SKIP };   /* sse.line */
enum { NAME_OTHER = 0xff };                 /* sse.name: not "data" */
enum { KEY_NONE = 0xff };                   /* sse.keylen: no key open */
enum { AFTER_COLON = 1, AFTER_VALUE = 2, AFTER_OPEN = 4 };

static const char *const KEYS[] = {
    "text", "content", "reasoning_content", "reasoning",
    "arguments", "delta", "partial_json", "thinking",
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])
#define ALL_KEYS ((uint8_t)((1u << NKEYS) - 1))
static const uint8_t KEY_LEN[NKEYS] = {4, 7, 17, 9, 9, 5, 12, 8};

void sse_init(struct sse *s) {
    memset(s, 0, sizeof *s);
    s->keylen = KEY_NONE;
}

static int space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* One byte of the event's data through the token NFA: every thread the pattern has at this
 * byte, at once (a key is open after every quote; those past a key wait for the colon, the
 * value's quote, or the value's first byte). */
static void token_step(struct sse *s, unsigned char c) {
    uint8_t was = s->after, after = 0;
    if ((was & AFTER_OPEN) && c != '"') {
        s->carries = 1;
        return;
    }
    if (was & AFTER_COLON) {
        if (space(c))
            after |= AFTER_COLON;
        else if (c == ':')
            after |= AFTER_VALUE;
    }
    if (was & AFTER_VALUE) {
        if (space(c))
            after |= AFTER_VALUE;
        else if (c == '"')
            after |= AFTER_OPEN;
    }
    if (c == '"') {
        if (s->keylen != KEY_NONE)
            for (unsigned k = 0; k < NKEYS; k++)
                if ((s->keys >> k & 1) && KEY_LEN[k] == s->keylen)
                    after |= AFTER_COLON;
        s->keylen = 0;
        s->keys = ALL_KEYS;
    } else if (s->keylen != KEY_NONE) {
        uint8_t keys = 0;
        for (unsigned k = 0; k < NKEYS; k++)
            if ((s->keys >> k & 1) && s->keylen < KEY_LEN[k] &&
                (unsigned char)KEYS[k][s->keylen] == c)
                keys |= (uint8_t)(1u << k);
        s->keys = keys;
        s->keylen = keys ? (uint8_t)(s->keylen + 1) : KEY_NONE;
    }
    s->after = after;
}

static void token_data(struct sse *s, const unsigned char *p, const unsigned char *end) {
    for (; p < end && !s->carries; p++) {
        if (s->after == 0 && s->keylen == KEY_NONE) { /* nothing open: only a quote matters */
            p = memchr(p, '"', (size_t)(end - p));
            if (p == NULL)
                return;
        }
        token_step(s, *p);
    }
}

/* A data line begins: its value follows the buffer's LF separator, if any came before. */
static void data_line(struct sse *s) {
    if (s->data && !s->carries)
        token_step(s, '\n');
    s->data = 1;
}

static long long line_end(struct sse *s) {
    long long dispatched = 0;
    if (s->line == START) { /* an empty line: the event */
        dispatched = s->data && s->carries;
        s->fields = s->data = s->carries = 0;
        s->keylen = KEY_NONE;
        s->keys = s->after = 0;
    } else if (s->line == NAME && s->name == 4) { /* "data" alone: an empty value */
        data_line(s);
    }
    s->line = START;
    s->name = 0;
    return dispatched;
}

/* The bytes of one line between `p` and `end` (no CR or LF among them), in its state. */
static void line_bytes(struct sse *s, const unsigned char *p, const unsigned char *end) {
    static const char DATA[4] = {'d', 'a', 't', 'a'};
    while (p < end) {
        switch (s->line) {
        case START:
            if (*p == ':') { /* a comment */
                s->line = SKIP;
                return;
            }
            s->line = NAME;
            s->fields = 1;
            break;
        case NAME:
            if (*p == ':') {
                p++;
                if (s->name != 4) {
                    s->line = SKIP;
                    return;
                }
                data_line(s);
                s->line = VALUE0;
                break;
            }
            s->name = s->name < 4 && DATA[s->name] == *p ? (uint8_t)(s->name + 1) : NAME_OTHER;
            p++;
            break;
        case VALUE0:
            s->line = VALUE;
            if (*p == ' ')
                p++;
            break;
        case VALUE:
            token_data(s, p, end);
            return;
        default: /* SKIP: a comment, or a field other than data */
            return;
        }
    }
}

static const unsigned char BOM[3] = {0xef, 0xbb, 0xbf};

long long sse_scan(struct sse *s, const char *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf, *end = p + n;
    long long count = 0;
    while (s->bom < 3 && p < end) { /* the stream's start: one U+FEFF is dropped */
        if (*p == BOM[s->bom]) {
            s->bom++;
            p++;
            continue;
        }
        if (s->bom > 0) { /* its first bytes were not one: they begin a field's name */
            s->line = NAME;
            s->name = NAME_OTHER;
            s->fields = 1;
        }
        s->bom = 3;
    }
    while (p < end) {
        if (s->cr) {
            s->cr = 0;
            if (*p == '\n') { /* CRLF: one line end */
                p++;
                continue;
            }
        }
        const unsigned char *eol = p;
        while (eol < end && *eol != '\n' && *eol != '\r')
            eol++;
        line_bytes(s, p, eol);
        if (eol == end)
            break;
        s->cr = *eol == '\r';
        count += line_end(s);
        p = eol + 1;
    }
    return count;
}

int sse_boundary(const struct sse *s) { return s->line == START && !s->fields; }

void hist_note(struct hist *h, const struct bounds *b, double gap) {
    int i = 0;
    while (i < b->n && b->at[i] < gap) /* bisect_left */
        i++;
    h->counts[i]++;
    h->total += gap;
}

long long progress_feed(struct progress *p, const struct bounds *b, struct hist *gaps,
                        const struct piece *pieces, int npieces, double now) {
    long long k = 0;
    for (int i = 0; i < npieces; i++)
        k += sse_scan(&p->sse, pieces[i].at, pieces[i].n);
    if (k > 0) {
        if (p->has_last)
            hist_note(gaps, b, now - p->last_t);
        p->has_last = 1;
        p->last_t = now;
    }
    return k;
}
