/* The benchmark upstream (benchmarks/upstream.py builds and starts it; docs/performance.md):
 * vLLM's streaming /v1/completions and /v1/chat/completions with the bytes a real vLLM 0.32
 * sends through uvicorn (tests/data/vllm/stream-*.http: one chunk of chunked encoding per event,
 * the same head and JSON keys), each event stamped with the Unix time it was written ("sim_t",
 * as the simulator's --stamp-events), at a set pace per stream, from several processes behind
 * SO_REUSEPORT. A benchmark tool, not product: loopback only, it trusts its clients.
 *
 *   upstream PORT PROCS TOKENS_PER_S STREAM_TOKENS MODEL
 *
 * STREAM_TOKENS 0: each request's max_tokens. The serving processes are titled
 * VLLM::EngineCore_DP<i>. Also served: GET /metrics (vLLM's series the
 * watchdog reads, from counters shared by the processes), /health, /v1/models, and the
 * benchmark's controls: POST /bench/freeze (no event, no answer leaves any process, as in a
 * hung engine: /metrics frozen, /health 200), /bench/thaw, and /bench/config with
 * {"tokens_per_s": R, "stream_tokens": N} for the streams that start after it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536
#define IN_MAX 8192
#define FINGERPRINT "vllm-0.32.0-ec4e4aa3"
#define CATCH_UP_NS 500000000

struct shared { /* one page shared by every process (mmap before fork) */
    long running, generated, prompt, finished, aborted, iterations, rate_milli, stream_tokens;
    int frozen;
};
static struct shared *sh;
static const char *model;

enum { READING, STREAMING, WHOLE };
struct conn {
    int fd, state, chat, role, hidx;
    long max, sent, created;
    int64_t next, period;
    char id[24];
    size_t inlen, outlen, outoff;
    char *out;
    struct conn *dead; /* the next in the list of ended connections not yet freed */
    char in[IN_MAX + 1];
};
static struct conn *conns[MAX_FD];
static struct conn *heap[MAX_FD];
static int heap_n, ep;

static const char *WORDS[] = {" the", " engine", " served", " every", " request", " until",
                              " it", " stopped", ";", " a", " watchdog", " noticed"};

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static double unix_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static long add(long *counter, long n) { return __atomic_add_fetch(counter, n, __ATOMIC_RELAXED); }
static long get(long *counter) { return __atomic_load_n(counter, __ATOMIC_RELAXED); }

/* -- the schedule: a min-heap of streaming connections by the time of their next event -- */
static void swap(int i, int j) {
    struct conn *c = heap[i];
    heap[i] = heap[j];
    heap[j] = c;
    heap[i]->hidx = i;
    heap[j]->hidx = j;
}

static void sift(int i) {
    while (i > 0 && heap[(i - 1) / 2]->next > heap[i]->next) {
        swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < heap_n && heap[l]->next < heap[m]->next) m = l;
        if (l + 1 < heap_n && heap[l + 1]->next < heap[m]->next) m = l + 1;
        if (m == i) return;
        swap(i, m);
        i = m;
    }
}

static void schedule(struct conn *c) {
    if (c->hidx >= 0) return sift(c->hidx);
    c->hidx = heap_n;
    heap[heap_n++] = c;
    sift(c->hidx);
}

static void unschedule(struct conn *c) {
    int i = c->hidx;
    if (i < 0) return;
    c->hidx = -1;
    if (i == --heap_n) return;
    heap[i] = heap[heap_n];
    heap[i]->hidx = i;
    sift(i);
}

/* -- output: one write per event, the rest kept (and the stream paused) while the client lags */
static void watch_out(struct conn *c, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = c->fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* A connection ends here; its memory only at the end of the loop's pass (bury), so that the
 * callers up the stack may still ask fd_open() of it. */
static struct conn *dead;

static void finish(struct conn *c) {
    if (c->fd < 0) return;
    if (c->state != READING) add(&sh->running, -1);
    if (c->state != READING) add(&sh->aborted, 1);
    unschedule(c);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    c->fd = -1;
    c->dead = dead;
    dead = c;
}

static void bury(void) {
    while (dead) {
        struct conn *c = dead;
        dead = c->dead;
        free(c->out);
        free(c);
    }
}

static void send_bytes(struct conn *c, const char *p, size_t n) {
    if (c->outlen == 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN) return finish(c);
        w = w < 0 ? 0 : w;
        p += w;
        n -= (size_t)w;
        if (n == 0) return;
        watch_out(c, 1);
    }
    char *grown = realloc(c->out, c->outlen + n);
    if (!grown) return finish(c);
    c->out = grown;
    memcpy(c->out + c->outlen, p, n);
    c->outlen += n;
}

static void drain(struct conn *c) {
    ssize_t w = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN) return finish(c);
    c->outoff += w < 0 ? 0 : (size_t)w;
    if (c->outoff < c->outlen) return;
    c->outlen = c->outoff = 0;
    watch_out(c, 0);
    if (c->state == STREAMING) schedule(c);
}

static int fd_open(struct conn *c) { return c->fd >= 0; }

static void http_date(char *out, size_t size) {
    time_t now = time(NULL);
    struct tm tm;
    strftime(out, size, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
}

static void answer(struct conn *c, int status, const char *type, const char *body) {
    char head[512], date[64];
    http_date(date, sizeof date);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\ncontent-length: %zu\r\n"
                     "content-type: %s\r\n\r\n",
                     status, status == 200 ? "OK" : "Not Found", date, strlen(body), type);
    send_bytes(c, head, (size_t)n);
    if (fd_open(c)) send_bytes(c, body, strlen(body));
}

static void chunk(struct conn *c, char *d, int n, long cap) {
    if (n < 0 || n >= cap) return finish(c);
    char size[16];
    int h = snprintf(size, sizeof size, "%x\r\n", n);
    memcpy(d - h, size, (size_t)h);
    memcpy(d + n, "\r\n", 2);
    send_bytes(c, d - h, (size_t)(h + n + 2));
}

/* One event of a stream: its chunk (size line, data, CRLF) in one write, as uvicorn writes it.
 * A chat stream opens with vLLM's role chunk, sent with the first token. */
static void event(struct conn *c) {
    char buf[1024], *d = buf + 16;
    long cap = sizeof buf - 32;
    double t = unix_s();
    if (c->role) {
        c->role = 0;
        int n = snprintf(d, cap,
                         "data: {\"id\":\"chatcmpl-%s\",\"object\":\"chat.completion.chunk\","
                         "\"created\":%ld,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
                         "\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                         "\"finish_reason\":null}],\"prompt_token_ids\":null,\"prompt_text\":null,"
                         "\"sim_t\":%.6f}\n\n",
                         c->id, c->created, model, t);
        chunk(c, d, n, cap);
        if (!fd_open(c)) return;
    }
    const char *word = WORDS[c->sent % (long)(sizeof WORDS / sizeof *WORDS)];
    int last = c->sent + 1 >= c->max, n;
    const char *reason = last ? "\"length\",\"stop_reason\":null" : "null";
    const char *tail = last ? ",\"system_fingerprint\":\"" FINGERPRINT "\"" : "";
    if (c->chat)
        n = snprintf(d, cap,
                     "data: {\"id\":\"chatcmpl-%s\",\"object\":\"chat.completion.chunk\","
                     "\"created\":%ld,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
                     "\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":%s,"
                     "\"token_ids\":null}]%s,\"sim_t\":%.6f}\n\n",
                     c->id, c->created, model, word, reason, tail, t);
    else
        n = snprintf(d, cap,
                     "data: {\"id\":\"cmpl-%s\",\"object\":\"text_completion\",\"created\":%ld,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"%s\",\"logprobs\":null,"
                     "\"finish_reason\":%s,\"stop_reason\":null,\"prompt_token_ids\":null,"
                     "\"token_ids\":null}]%s,\"sim_t\":%.6f}\n\n",
                     c->id, c->created, model, word, last ? "\"length\"" : "null", tail, t);
    chunk(c, d, n, cap);
}

static void start(struct conn *c, int chat, long max_tokens, int stream) {
    static uint64_t serial;
    long rate = get(&sh->rate_milli), fixed = get(&sh->stream_tokens);
    c->state = stream ? STREAMING : WHOLE;
    c->chat = chat;
    c->role = chat && stream;
    c->sent = 0;
    c->max = fixed > 0 ? fixed : (max_tokens > 0 ? max_tokens : 16);
    c->period = rate > 0 ? (int64_t)(1e12 / (double)rate) : 0;
    c->created = (long)time(NULL);
    snprintf(c->id, sizeof c->id, "%08x%08lx", (unsigned)getpid() * 2654435761u,
             (unsigned long)++serial);
    add(&sh->running, 1);
    add(&sh->prompt, 8);
    c->next = mono_ns() + c->period * (stream ? 1 : c->max);
    if (stream) {
        char head[256], date[64];
        http_date(date, sizeof date);
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\ndate: %s\r\nserver: uvicorn\r\ncontent-type: "
                         "text/event-stream; charset=utf-8\r\nvary: Origin\r\n"
                         "transfer-encoding: chunked\r\n\r\n",
                         date);
        send_bytes(c, head, (size_t)n);
    }
    if (fd_open(c) && c->outlen == 0) schedule(c);
}

static void done(struct conn *c) {
    unschedule(c);
    c->state = READING;
    add(&sh->running, -1);
    add(&sh->finished, 1);
}

static void end_stream(struct conn *c) {
    static const char end[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    done(c);
    send_bytes(c, end, sizeof end - 1);
}

static void whole(struct conn *c) {
    char body[1024];
    const char *w = WORDS[0];
    if (c->chat)
        snprintf(body, sizeof body,
                 "{\"id\":\"chatcmpl-%s\",\"object\":\"chat.completion\",\"created\":%ld,\"model\":"
                 "\"%s\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                 "\"%s\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                 "\"usage\":{\"prompt_tokens\":8,\"total_tokens\":%ld,\"completion_tokens\":%ld}}",
                 c->id, c->created, model, w, c->max + 8, c->max);
    else
        snprintf(body, sizeof body,
                 "{\"id\":\"cmpl-%s\",\"object\":\"text_completion\",\"created\":%ld,\"model\":"
                 "\"%s\",\"choices\":[{\"index\":0,\"text\":\"%s\",\"logprobs\":null,"
                 "\"finish_reason\":\"length\",\"stop_reason\":null,\"prompt_logprobs\":null}],"
                 "\"usage\":{\"prompt_tokens\":8,\"total_tokens\":%ld,\"completion_tokens\":%ld}}",
                 c->id, c->created, model, w, c->max + 8, c->max);
    add(&sh->generated, c->max);
    done(c);
    answer(c, 200, "application/json", body);
}

static void metrics(struct conn *c) {
    static const char *help[][2] = {
        {"num_requests_running", "Number of requests in model execution batches."},
        {"num_requests_waiting", "Number of requests waiting to be processed."},
        {"kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."},
        {"num_preemptions_total", "Cumulative number of preemption from the engine."},
        {"prompt_tokens_total", "Number of prefill tokens processed."},
        {"generation_tokens_total", "Number of generation tokens processed."}};
    long running = get(&sh->running), its = get(&sh->iterations);
    double values[] = {(double)running, 0.0, running * 1e-4, 0.0, (double)get(&sh->prompt),
                       (double)get(&sh->generated)};
    char body[8192];
    int n = 0;
    for (int i = 0; i < 6; i++)
        n += snprintf(body + n, sizeof body - n,
                      "# HELP vllm:%s %s\n# TYPE vllm:%s %s\nvllm:%s{engine=\"0\",model_name=\"%s\"}"
                      " %.1f\n",
                      help[i][0], help[i][1], help[i][0], i < 3 ? "gauge" : "counter", help[i][0],
                      model, values[i]);
    n += snprintf(body + n, sizeof body - n,
                  "# HELP vllm:request_success_total Count of successfully processed requests.\n"
                  "# TYPE vllm:request_success_total counter\n");
    const char *reasons[] = {"stop", "length", "abort"};
    long counts[] = {0, get(&sh->finished), get(&sh->aborted)};
    for (int i = 0; i < 3; i++)
        n += snprintf(body + n, sizeof body - n,
                      "vllm:request_success_total{engine=\"0\",finished_reason=\"%s\","
                      "model_name=\"%s\"} %ld.0\n",
                      reasons[i], model, counts[i]);
    n += snprintf(body + n, sizeof body - n,
                  "# HELP vllm:iteration_tokens_total Histogram of number of tokens per "
                  "engine_step.\n# TYPE vllm:iteration_tokens_total histogram\n"
                  "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"+Inf\",model_name=\"%s\"}"
                  " %ld.0\nvllm:iteration_tokens_total_count{engine=\"0\",model_name=\"%s\"} "
                  "%ld.0\nvllm:iteration_tokens_total_sum{engine=\"0\",model_name=\"%s\"} %.1f\n",
                  model, its, model, its, model, values[5]);
    answer(c, 200, "text/plain; version=0.0.4; charset=utf-8", body);
}

static long number(const char *body, const char *key, long fallback) {
    const char *at = strstr(body, key);
    if (!at) return fallback;
    at += strlen(key);
    while (*at == ' ' || *at == ':') at++;
    return strtol(at, NULL, 10);
}

static void route(struct conn *c, char *head, char *body) {
    int chat = !strncmp(head, "POST /v1/chat/completions ", 26);
    if (chat || !strncmp(head, "POST /v1/completions ", 21)) {
        const char *s = strstr(body, "\"stream\"");
        s = s ? s + 8 : "";
        while (*s == ' ' || *s == ':') s++;
        int stream = !strncmp(s, "true", 4);
        return start(c, chat, number(body, "\"max_tokens\"", 16), stream);
    }
    if (!strncmp(head, "GET /metrics ", 13)) return metrics(c);
    if (!strncmp(head, "GET /health ", 12)) return answer(c, 200, "application/json", "");
    if (!strncmp(head, "GET /v1/models ", 15)) {
        char body_out[512];
        snprintf(body_out, sizeof body_out,
                 "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":"
                 "%ld,\"owned_by\":\"vllm\",\"root\":\"%s\",\"parent\":null}]}",
                 model, (long)time(NULL), model);
        return answer(c, 200, "application/json", body_out);
    }
    if (!strncmp(head, "POST /bench/", 12)) {
        if (!strncmp(head + 12, "freeze ", 7)) __atomic_store_n(&sh->frozen, 1, __ATOMIC_RELAXED);
        if (!strncmp(head + 12, "thaw ", 5)) __atomic_store_n(&sh->frozen, 0, __ATOMIC_RELAXED);
        if (!strncmp(head + 12, "config ", 7)) {
            long rate = number(body, "\"tokens_per_s\"", get(&sh->rate_milli) / 1000);
            __atomic_store_n(&sh->rate_milli, rate * 1000, __ATOMIC_RELAXED);
            __atomic_store_n(&sh->stream_tokens, number(body, "\"stream_tokens\"", 0),
                             __ATOMIC_RELAXED);
        }
        return answer(c, 200, "application/json", "{}");
    }
    answer(c, 404, "application/json", "{\"detail\":\"Not Found\"}");
}

/* Requests, one at a time per connection (a keep-alive connection's next waits for the last). */
static void requests(struct conn *c) {
    while (c->state == READING && fd_open(c)) {
        c->in[c->inlen] = 0;
        char *end = memmem(c->in, c->inlen, "\r\n\r\n", 4);
        if (!end) {
            if (c->inlen >= IN_MAX) finish(c);
            return;
        }
        size_t head = (size_t)(end - c->in) + 4, body = 0;
        *end = 0;
        char *cl = strcasestr(c->in, "\r\ncontent-length:");
        if (cl) body = strtoul(cl + 17, NULL, 10);
        if (head + body > IN_MAX) return finish(c);
        if (c->inlen < head + body) {
            *end = '\r';
            return;
        }
        char saved = c->in[head + body];
        c->in[head + body] = 0;
        route(c, c->in, c->in + head);
        if (!fd_open(c)) return;
        c->in[head + body] = saved;
        memmove(c->in, c->in + head + body, c->inlen - head - body);
        c->inlen -= head + body;
    }
}

static void readable(struct conn *c) {
    if (c->inlen >= IN_MAX) return finish(c); /* a request over IN_MAX, or a flood mid-stream */
    ssize_t n = read(c->fd, c->in + c->inlen, IN_MAX - c->inlen);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return finish(c);
    c->inlen += n > 0 ? (size_t)n : 0;
    requests(c);
}

static void tick(void) {
    if (__atomic_load_n(&sh->frozen, __ATOMIC_RELAXED)) return;
    int64_t now = mono_ns();
    long sent = 0;
    while (heap_n && heap[0]->next <= now) {
        struct conn *c = heap[0];
        if (c->state == WHOLE) {
            whole(c);
            continue;
        }
        event(c);
        if (!fd_open(c)) continue;
        sent++;
        if (++c->sent >= c->max) {
            end_stream(c);
            if (fd_open(c)) requests(c);
            continue;
        }
        c->next += c->period; /* a late wake-up catches up: the pace asked is the pace served */
        if (c->next < now - CATCH_UP_NS) c->next = now; /* after a freeze: no burst */
        if (c->outlen)
            unschedule(c); /* the client lags: drain() schedules it again */
        else
            sift(0);
    }
    if (sent) {
        add(&sh->generated, sent);
        add(&sh->iterations, 1);
    }
}

static void serve(int port) {
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 4096)) {
        perror("upstream: bind");
        exit(2);
    }
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd}, evs[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    for (;;) {
        int timeout = -1;
        if (heap_n && __atomic_load_n(&sh->frozen, __ATOMIC_RELAXED))
            timeout = 5; /* frozen: look again for the thaw */
        else if (heap_n) {
            int64_t dt = heap[0]->next - mono_ns();
            timeout = dt <= 0 ? 0 : (int)((dt + 999999) / 1000000);
        }
        int n = epoll_wait(ep, evs, 256, timeout);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd, cfd;
            if (fd == lfd) {
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct conn *c = cfd < MAX_FD ? calloc(1, sizeof *c) : NULL;
                    if (!c) {
                        close(cfd);
                        continue;
                    }
                    c->fd = cfd;
                    c->hidx = -1;
                    conns[cfd] = c;
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            struct conn *c = conns[fd];
            if (c && (evs[i].events & EPOLLOUT) && c->outlen) drain(c);
            c = conns[fd];
            if (c && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) readable(c);
        }
        tick();
        bury();
    }
}

/* Each serving process is titled as vLLM titles its engine core (setproctitle's way: argv's own
 * bytes), so that the watchdog finds it as the engine and reads its CPU: idle while frozen. */
static void title(int argc, char **argv, int i) {
    char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]);
    char name[32];
    snprintf(name, sizeof name, "VLLM::EngineCore_DP%d", i);
    memset(start, 0, (size_t)(end - start));
    memcpy(start, name, strlen(name) < (size_t)(end - start) ? strlen(name) : 0);
    prctl(PR_SET_NAME, "VLLM::EngineCor");
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: upstream PORT PROCS TOKENS_PER_S STREAM_TOKENS MODEL\n");
        return 2;
    }
    int port = atoi(argv[1]), procs = atoi(argv[2]);
    model = strdup(argv[5]); /* argv's bytes become the title */
    struct rlimit r;
    if (!getrlimit(RLIMIT_NOFILE, &r)) {
        r.rlim_cur = r.rlim_max < MAX_FD ? r.rlim_max : MAX_FD;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || port <= 0 || procs <= 0 || strlen(model) > 200) return 2;
    sh->rate_milli = (long)(atof(argv[3]) * 1000);
    sh->stream_tokens = atol(argv[4]);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    pid_t parent = getpid(), children[256];
    procs = procs > 256 ? 256 : procs;
    for (int i = 0; i < procs; i++)
        if ((children[i] = fork()) == 0) {
            sigprocmask(SIG_UNBLOCK, &set, NULL);
            signal(SIGPIPE, SIG_IGN);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            title(argc, argv, i);
            serve(port);
        }
    int sig = 0;
    sigwait(&set, &sig); /* a stop, or a child gone: every process ends */
    for (int i = 0; i < procs; i++)
        if (children[i] > 0) kill(children[i], SIGTERM);
    while (wait(NULL) > 0) {
    }
    return sig == SIGCHLD ? 1 : 0;
}
