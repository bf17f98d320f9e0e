/* The resident client: create/run handed to the resident process (`cdi-shim runtime serve`),
 * with a claim that lets us take the request back while no worker has begun it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frontend.h"
#include "../engine/cleanup.h"
#include "../engine/resident.h"

/* A growable byte buffer for the resident request. */
struct bytes {
    char *data;
    size_t len, cap;
};

static int put(struct bytes *b, const char *field)
{
    size_t n = strlen(field) + 1;
    if (b->len + n > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 8192) + n;
        char *data = realloc(b->data, cap);
        if (!data)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, field, n);
    b->len += n;
    return 0;
}

static void free_bytes(struct bytes *b) { free(b->data); }

static int send_request(int fd, const struct bytes *body, int token)
{
    const char magic[8] = {'C', 'D', 'S', 'H', 'I', 'M', '0' + CDS_RESIDENT_PROTOCOL, '\0'};
    unsigned char header[12];
    uint32_t len = (uint32_t)body->len;
    memcpy(header, magic, 8);
    for (int i = 0; i < 4; i++)
        header[8 + i] = (unsigned char)(len >> (8 * i));
    /* The claim goes along (see claim()); our stderr does not: the worker's messages come back
     * in the answer, so a full stderr pipe blocks us, never a worker. */
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof(control));
    struct iovec iov[2] = {{header, sizeof(header)}, {body->data, body->len}};
    struct msghdr msg = {
        .msg_iov = iov, .msg_iovlen = 2, .msg_control = control.buf, .msg_controllen = sizeof(control.buf)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &token, sizeof(int));
    ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0)
        return -1;
    size_t total = sizeof(header) + body->len;
    while ((size_t)sent < total) { /* the rest without the descriptor */
        size_t off = (size_t)sent - sizeof(header);
        ssize_t n = send(fd, body->data + off, body->len - off, MSG_NOSIGNAL);
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0)
            sent += n;
    }
    return 0;
}

/* The claim on a request: a pipe (non-blocking) holding two bytes, whose read end the worker
 * gets with the request. A worker reads the first before it starts the work and the second
 * before its first write; we read one before we run the interpreter instead. Reads are atomic,
 * so when we get either byte, no worker has written anything, nor will. */
static int claim(int token)
{
    char byte;
    ssize_t n;
    do
        n = read(token, &byte, 1);
    while (n < 0 && errno == EINTR);
    return n == 1;
}

static long ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)(now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Wait until FD is readable or MS milliseconds have passed: 1, or 0 on timeout. */
static int wait_readable(int fd, long ms)
{
    struct pollfd ready = {.fd = fd, .events = POLLIN};
    int polled;
    do
        polled = poll(&ready, 1, ms < 0 ? 0 : (int)ms);
    while (polled < 0 && errno == EINTR);
    return polled != 0;
}

/* A whole answer in REPLY ("A<status>\0<n>\0<n bytes of messages><argv fields>"): its status, and
 * where its messages and argv begin; -1 while incomplete or malformed. */
static int parse_answer(const struct bytes *reply, long *status, const char **messages, size_t *messages_len,
                        const char **argv_at)
{
    const char *end = reply->data + reply->len;
    if (reply->len < 2 || reply->data[0] != 'A')
        return -1;
    const char *status_end = memchr(reply->data + 1, '\0', reply->len - 1);
    if (!status_end || status_end == reply->data + 1)
        return -1;
    const char *len_end = memchr(status_end + 1, '\0', (size_t)(end - status_end - 1));
    if (!len_end || len_end == status_end + 1)
        return -1;
    char *stop;
    *status = strtol(reply->data + 1, &stop, 10);
    if (stop != status_end)
        return -1;
    unsigned long n = strtoul(status_end + 1, &stop, 10);
    if (stop != len_end || n > (unsigned long)(end - len_end - 1))
        return -1;
    *messages = len_end + 1;
    *messages_len = n;
    *argv_at = len_end + 1 + n;
    return 0;
}

/* A connection to the resident process at SET->socket, served by our own uid; -1 when it is not
 * there (the usual case without the service) or is someone else's. */
static int connect_resident(const struct settings *set)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, set->socket);
    cleanup_fd int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        return -1;
    struct ucred peer = {.uid = (uid_t)-1};
    socklen_t peer_len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) < 0 || peer.uid != geteuid()) {
        fprintf(stderr, "cdi-shim: ignoring %s: served by uid %d, not by us\n", set->socket, (int)peer.uid);
        return -1;
    }
    return cds_take_fd(&fd);
}

/* The request's body (resident.py has its fields): our version, CWD, umask, argv and environment;
 * 0, or -1 when it could not be made. */
static int request_body(struct bytes *body, const char *cwd, int argc, char **argv)
{
    extern char **environ;
    char field[32];
    mode_t mask = umask(0);
    umask(mask);
    int failed = put(body, CDS_VERSION) | put(body, cwd);
    snprintf(field, sizeof(field), "%o", (unsigned)mask);
    failed |= put(body, field);
    snprintf(field, sizeof(field), "%d", argc - 1);
    failed |= put(body, field);
    for (int i = 1; i < argc; i++)
        failed |= put(body, argv[i]);
    for (char **env = environ; *env; env++)
        failed |= put(body, *env);
    return failed ? -1 : 0;
}

/* The answer on FD into REPLY, until the worker closes it or CDS_RESIDENT_ANSWER_WAIT_MS from
 * START have passed: 0, or why it stopped (an errno: ETIMEDOUT, EFBIG, the read's); -1 out of
 * memory. */
static int read_answer(int fd, struct bytes *reply, const struct timespec *start)
{
    for (;;) {
        long left = CDS_RESIDENT_ANSWER_WAIT_MS - ms_since(start);
        if (left <= 0 || !wait_readable(fd, left))
            return ETIMEDOUT;
        if (reply->cap - reply->len < 4096) {
            char *data = realloc(reply->data, reply->cap + 65536);
            if (!data)
                return -1;
            reply->data = data;
            reply->cap += 65536;
        }
        ssize_t n = read(fd, reply->data + reply->len, reply->cap - reply->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : 0;
        reply->len += (size_t)n;
        if (reply->len > CDS_RESIDENT_MAX_ANSWER)
            return EFBIG;
    }
}

/* After a whole answer (REPLY: its status, its MESSAGES and the argv from ARGV_AT): the
 * messages on our stderr, then the runtime it names exec'd (after_create.c, with CREATE), or
 * the worker's failure status. */
static int follow_answer(const struct settings *set, const struct bytes *reply, long status, const char *messages,
                         size_t messages_len, const char *argv_at, const struct create_line *create)
{
    char message[8192];
    for (size_t off = 0; off < messages_len;) { /* the create's messages, on our stderr */
        ssize_t n = write(STDERR_FILENO, messages + off, messages_len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (status != 0)
        return (int)status; /* the child reported why on our stderr and in runc's log */
    cleanup_free char **args = calloc(reply->len, sizeof(char *));
    if (!args)
        return 127;
    int n = 0;
    for (const char *p = argv_at; p < reply->data + reply->len; p += strlen(p) + 1)
        args[n++] = (char *)p;
    int run = exec_runtime_at(set, args[0], args, create, NULL, 0); /* the worker wrote config.json */
    if (run >= 0)
        return run;
    snprintf(message, sizeof(message), "cdi-shim: cannot run the low-level runtime \"%s\": %s", args[0],
             strerror(errno));
    report(message);
    return 127;
}

/* Hand create/run to the resident process (shim/runtime/resident.py has the protocol,
 * csrc/engine/resident.h its bounds). Returns -1 when nothing was touched and the caller should
 * start the interpreter itself: the server is not there, declines, no worker claimed the request
 * within CDS_RESIDENT_CLAIM_WAIT_MS (every worker busy), or the worker that did gave no whole
 * answer within CDS_RESIDENT_ANSWER_WAIT_MS before its first write; we took the request back.
 * Otherwise execs the runtime it names, or returns the exit status. */
int try_resident(const struct settings *set, int argc, char **argv, const struct create_line *create)
{
    char cwd[4096], message[8192];
    struct timespec start;

    if (!set->socket[0] || !getcwd(cwd, sizeof(cwd)))
        return -1; /* (a deleted working directory: the interpreter copes with it) */
    cleanup_fd int fd = connect_resident(set);
    if (fd < 0)
        return -1;
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    cleanup_fd int token = pipe_fds[0];
    int ready_token = write(pipe_fds[1], "CW", 2) == 2; /* resident.py CLAIM, PERMIT */
    close(pipe_fds[1]);
    __attribute__((cleanup(free_bytes))) struct bytes body = {0};
    int failed = (ready_token ? 0 : -1) | request_body(&body, cwd, argc, argv);
    __attribute__((cleanup(free_bytes))) struct bytes reply = {.data = malloc(65536), .cap = 65536};
    if (failed || !reply.data)
        return -1;
    int why = 0;
    long status = 0;
    const char *messages = NULL, *argv_at = NULL;
    size_t messages_len = 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (send_request(fd, &body, token) < 0) {
        why = errno;
    } else {
        /* A worker takes the request up within a moment, or every worker is busy (or the
         * server is stuck): then we claim it back and the interpreter does it here; a worker
         * that gets to it later finds the claim gone and does nothing. */
        if (!wait_readable(fd, CDS_RESIDENT_CLAIM_WAIT_MS) && claim(token))
            return -1;
        /* An answer is coming, or a worker has claimed the request: wait for all of it, as
         * long as the bound. */
        why = read_answer(fd, &reply, &start);
        if (why < 0)
            return 127;
    }
    reply.data[reply.len] = '\0';
    int whole = why != EFBIG && parse_answer(&reply, &status, &messages, &messages_len, &argv_at) == 0
        && (status != 0 || argv_at < reply.data + reply.len);
    /* Declined ("F"), or no whole answer: if we can take a byte of the claim back, no worker
     * has written anything, nor will one. */
    if (!whole && claim(token))
        return -1;
    /* A worker began the work and may have written: whatever goes wrong now is a failure,
     * never a second run through the interpreter. */
    if (!whole) {
        snprintf(message, sizeof(message),
                 "cdi-shim: the resident process at %s stopped before it "
                 "answered (%s); the container was not started",
                 set->socket,
                 why == ETIMEDOUT   ? "no answer within the bound, a worker stalled after it began writing"
                     : why == EFBIG ? "answer too large"
                     : why          ? strerror(why)
                                    : "connection closed");
        report(message);
        return 1;
    }
    return follow_answer(set, &reply, status, messages, messages_len, argv_at, create);
}
