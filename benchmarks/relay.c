/* The floor of any proxy on this machine: a byte relay in C that does nothing but what every
 * proxy must, one read from the engine and one write to the client per chunk (benchmarks/relays.py
 * builds and runs it; docs/performance.md). Loopback only; blocking sockets read only when epoll
 * says they are readable. Usage: relay UPSTREAM_PORT LISTEN_PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
static int peer[MAX_FD];

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static void watch(int ep, int fd) {
    int one = 1;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static void pair(int ep, int client, int up_port) {
    struct sockaddr_in up = loopback(up_port);
    int engine = socket(AF_INET, SOCK_STREAM, 0);
    if (client >= MAX_FD || engine < 0 || engine >= MAX_FD ||
        connect(engine, (struct sockaddr *)&up, sizeof up)) {
        close(client);
        if (engine >= 0) close(engine);
        return;
    }
    peer[client] = engine;
    peer[engine] = client;
    watch(ep, client);
    watch(ep, engine);
}

static void pass(int fd) {
    static char buf[65536];
    ssize_t n = read(fd, buf, sizeof buf), off = 0;
    if (n <= 0) {
        close(peer[fd]);
        close(fd);
        return;
    }
    while (off < n) {
        ssize_t w = write(peer[fd], buf + off, n - off);
        if (w <= 0) return;
        off += w;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int up_port = atoi(argv[1]), one = 1;
    struct sockaddr_in here = loopback(atoi(argv[2]));
    int ls = socket(AF_INET, SOCK_STREAM, 0), ep = epoll_create1(0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&here, sizeof here) || listen(ls, 2048)) {
        perror("relay");
        return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, ready[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    for (;;) {
        int n = epoll_wait(ep, ready, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == ls) {
                int client = accept(ls, NULL, NULL);
                if (client >= 0) pair(ep, client, up_port);
            } else {
                pass(fd);
            }
        }
    }
}
