/*
 * A deliberately naive HTTP handler for the end-to-end cluster (tools/k8s/handler-image.sh): the
 * kind of user service that runs beside the worker as its handler sidecar.
 *
 * - Listens on 0.0.0.0:$PORT (default 8080); one forked process per connection, one request per
 *   connection (answers carry `Connection: close`).
 * - POST: reads the body (Content-Length), records it at once as one line in a file of its own under
 *   $RECORD_DIR, `<host>-<start>-<n>.json` (written as `.tmp`, then renamed, so a reader never
 *   sees half a body), then waits $DELAY_MS milliseconds (default 1500) and only then answers 200,
 *   and marks the answer with an empty `<host>-<start>-<n>.answered`. A batch is thus "handled"
 *   (its effect recorded) long before the worker hears so: a stop in between makes the worker
 *   deliver it again.
 * - Any other method (the worker's readiness probe of handler.http.readinessPath): 200 at once.
 * - SIGTERM: exits at once, in-flight requests unanswered, like a service that does nothing special
 *   about shutdown (an explicit handler: as PID 1 of its container, a default disposition would
 *   ignore the signal).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEADER_LIMIT 65536

static const char *record_dir = "/records";
static long delay_ms = 1500;
static char host[128] = "handler";
static long long started_ns;
/* This process's record, without its extension. */
static char base[480];

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static int write_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static int answer(int fd, const char *status) {
    char response[256];
    int len = snprintf(response, sizeof response,
                       "HTTP/1.1 %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status);
    return write_all(fd, response, (size_t)len);
}

static void pause_ms(long ms) {
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) < 0 && errno == EINTR) {
    }
}

/* Stores `body` as one line in a new file; 0 on success. */
static int record(const char *body, size_t len, unsigned long sequence) {
    char final[512], tmp[sizeof final];
    snprintf(base, sizeof base, "%s/%s-%lld-%lu", record_dir, host, started_ns, sequence);
    snprintf(final, sizeof final, "%s.json", base);
    snprintf(tmp, sizeof tmp, "%s.tmp", base);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "handler: open %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    int failed = write_all(fd, body, len) < 0 || write_all(fd, "\n", 1) < 0;
    failed |= close(fd) < 0;
    if (failed || rename(tmp, final) < 0) {
        fprintf(stderr, "handler: write %s: %s\n", final, strerror(errno));
        return -1;
    }
    return 0;
}

/* Marks the recorded batch answered. */
static void mark_answered(void) {
    char marker[512];
    snprintf(marker, sizeof marker, "%s.answered", base);
    int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
}

/* Reads one request; the status line to answer, or NULL to close without answering. */
static const char *handle(int fd, unsigned long sequence) {
    static char buffer[HEADER_LIMIT + 1];
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have == HEADER_LIMIT) return "431 Request Header Fields Too Large";
        ssize_t n = read(fd, buffer + have, HEADER_LIMIT - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        have += (size_t)n;
        buffer[have] = '\0';
        end = strstr(buffer, "\r\n\r\n");
    }
    size_t header_len = (size_t)(end - buffer) + 4;
    if (strncmp(buffer, "POST ", 5) != 0) return "200 OK";

    size_t length = 0;
    for (char *line = strstr(buffer, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "Content-Length:", 15) == 0) length = strtoul(line + 17, NULL, 10);
    }
    char *body = malloc(length + 1);
    if (!body) return "500 Internal Server Error";
    size_t got = have - header_len < length ? have - header_len : length;
    memcpy(body, buffer + header_len, got);
    while (got < length) {
        ssize_t n = read(fd, body + got, length - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        got += (size_t)n;
    }
    if (record(body, length, sequence) < 0) return "500 Internal Server Error";
    pause_ms(delay_ms);
    return "200 OK";
}

int main(void) {
    const char *value;
    int port = 8080;
    if ((value = getenv("PORT"))) port = atoi(value);
    if ((value = getenv("RECORD_DIR"))) record_dir = value;
    if ((value = getenv("DELAY_MS"))) delay_ms = atol(value);
    gethostname(host, sizeof host - 1);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    started_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;

    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);

    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int on = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) < 0 ||
        listen(listener, 128) < 0) {
        perror("handler: listen");
        return 1;
    }
    fprintf(stderr, "handler: %s listening on 0.0.0.0:%d, recording into %s, answering after %ld ms\n",
            host, port, record_dir, delay_ms);
    for (unsigned long sequence = 0;; sequence++) {
        int connection = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (connection < 0) continue;
        pid_t child = fork();
        if (child == 0) {
            close(listener);
            const char *status = handle(connection, sequence);
            if (status && answer(connection, status) == 0 && base[0] && strncmp(status, "200", 3) == 0) {
                mark_answered();
            }
            close(connection);
            _exit(0);
        }
        close(connection);
    }
}
