/*
 * chaos.h - what the chaos suites (tests/chaos/, issue 22) share.
 *
 * Every case is bounded in count and time and prints its figures as
 * "CHAOS <case>: ..." lines. Their size: small in `make test` (CI),
 * COHORT_CHAOS=full (`make chaos`) for the issue's own numbers.
 *
 * Helpers: cohortd started under a descriptor limit (prlimit), its RSS and
 * CPU time from /proc, connections from a chosen source address (any of
 * 127/8 is this host), and raw requests of the cohort protocol (nng's SP
 * framing over TCP, as libcohort's req0 socket sends them) so that a test
 * can hold connections in states no client library would.
 */
#ifndef COHORT_CHAOS_H
#define COHORT_CHAOS_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_cohort.h"
#include "wire.h"

/* `make chaos`: the sizes. */
static inline bool
chaos_full(void)
{
	const char *e = getenv("COHORT_CHAOS");

	return (e != NULL && strcmp(e, "full") == 0);
}

static inline long
chaos_n(long small, long full)
{
	return (chaos_full() ? full : small);
}

/* VmRSS of pid in KiB (0 if gone). */
static inline long
chaos_rss_kib(pid_t pid)
{
	char p[64], line[256];
	long kib = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
	if ((f = fopen(p, "r")) == NULL)
		return (0);
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %ld", &kib) == 1)
			break;
	fclose(f);
	return (kib);
}

/* CPU seconds (user + system) pid used so far. */
static inline double
chaos_cpu_s(pid_t pid)
{
	char p[64], buf[1024], *rp;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	if ((f = fopen(p, "r")) == NULL)
		return (0);
	if (fgets(buf, sizeof(buf), f) == NULL
	    || (rp = strrchr(buf, ')')) == NULL
	    || sscanf(rp + 2,
	           "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
	           &st)
	        != 2)
		ut = st = 0;
	fclose(f);
	return ((double)(ut + st) / (double)sysconf(_SC_CLK_TCK));
}

/* Starts cohortd (on a free loopback port) with extra args, under
 * `prlimit --nofile=nofile` when nofile is not NULL; as th_coord_start. */
static inline void
chaos_coord_start(
    struct th_coord *c, const char *nofile, const char *const *extra)
{
	char lim[64];
	const char *const prlimit[] = { "/usr/bin/prlimit", lim, NULL };

	snprintf(
	    lim, sizeof(lim), "--nofile=%s", nofile != NULL ? nofile : "");
	th_coord_start_under(c, nofile != NULL ? prlimit : NULL, extra);
}

/* A TCP connection from src (an address of this host, "127.0.0.2") to
 * 127.0.0.1:port, non-blocking once connected; -1 if refused. */
static inline int
chaos_connect_from(const char *src, int port)
{
	struct sockaddr_in a, b;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return (-1);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	if (src != NULL) {
		inet_pton(AF_INET, src, &a.sin_addr);
		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
			close(fd);
			return (-1);
		}
	}
	memset(&b, 0, sizeof(b));
	b.sin_family = AF_INET;
	b.sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, "127.0.0.1", &b.sin_addr);
	if (connect(fd, (struct sockaddr *)&b, sizeof(b)) != 0) {
		close(fd);
		return (-1);
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return (fd);
}

/* Whether the peer closed fd (drains what is pending). */
static inline bool
chaos_closed(int fd)
{
	char b[4096];
	ssize_t k;

	while ((k = recv(fd, b, sizeof(b), MSG_DONTWAIT)) > 0)
		;
	return (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK));
}

static inline void
chaos_be64(uint8_t *b, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		b[i] = (uint8_t)v;
}

/* nng's SP header of a req0 peer. */
static const uint8_t chaos_sp_req[8] = { 0, 'S', 'P', 0, 0, 0x30, 0, 0 };

/* Moves all n bytes at b through fd: sent when out (each wait for room
 * bounded by timeout_ms), else received (all of them within timeout_ms).
 * False if the peer closed or the time ran out. */
static inline bool
chaos_io_all(int fd, uint8_t *b, size_t n, bool out, int timeout_ms)
{
	int64_t end = th_now_ms() + timeout_ms;

	while (n > 0) {
		struct pollfd pf = { fd, out ? POLLOUT : POLLIN, 0 };
		ssize_t k;
		int left = out ? timeout_ms : (int)(end - th_now_ms());
		if (left <= 0 || poll(&pf, 1, left) != 1)
			return (false);
		k = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (k <= 0)
			return (false);
		b += k;
		n -= (size_t)k;
	}
	return (true);
}

/* Sends all of p (blocking, bounded by poll); false if the peer closed. */
static inline bool
chaos_send_all(int fd, const void *p, size_t n, int timeout_ms)
{
	return (
	    chaos_io_all(fd, (uint8_t *)(uintptr_t)p, n, true, timeout_ms));
}

/* Reads exactly n bytes within timeout_ms. */
static inline bool
chaos_recv_all(int fd, void *p, size_t n, int timeout_ms)
{
	return (chaos_io_all(fd, p, n, false, timeout_ms));
}

/* One request of job/token as client id over fd (SP header first when
 * hello), its reply's status (or -1: no reply within timeout_ms). The
 * request: a KvNumKeys (answered at once; binds the client to the
 * connection, which then counts as authenticated). */
static inline int
chaos_sp_request(int fd, bool hello, const char *job, const char *token,
    uint64_t id, uint64_t seq, int timeout_ms)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvNumKeys nk = COHORT__KV_NUM_KEYS__INIT;
	Cohort__Reply *rep = NULL;
	const uint8_t *pl;
	size_t plen, len;
	uint8_t hdr[12], sp[8];
	nng_msg *m;
	int st = -1;

	req.proto_version = COHORT_PROTO_VERSION;
	req.job = (char *)job;
	req.token = (char *)token;
	req.seq = seq;
	req.client_id = id;
	req.rank = -1;
	req.body_case = COHORT__REQUEST__BODY_KV_NUM_KEYS;
	req.kv_num_keys = &nk;
	if (cohort__wire_pack_request(&req, NULL, 0, &m) != COHORT_OK)
		return (-1);
	len = nng_msg_len(m);
	chaos_be64(hdr, len + 4);
	hdr[8] = 0x80;
	hdr[9] = 0;
	hdr[10] = (uint8_t)(seq >> 8);
	hdr[11] = (uint8_t)seq;
	if ((hello && !chaos_send_all(fd, chaos_sp_req, 8, timeout_ms))
	    || !chaos_send_all(fd, hdr, sizeof(hdr), timeout_ms)
	    || !chaos_send_all(fd, nng_msg_body(m), len, timeout_ms)) {
		nng_msg_free(m);
		return (-1);
	}
	nng_msg_free(m);
	if (hello && !chaos_recv_all(fd, sp, 8, timeout_ms))
		return (-1);
	if (!chaos_recv_all(fd, hdr, 12, timeout_ms))
		return (-1);
	len = 0;
	for (int i = 0; i < 8; i++)
		len = len << 8 | hdr[i];
	if (len < 4 || len > (1u << 20) || nng_msg_alloc(&m, len - 4) != 0)
		return (-1);
	if (chaos_recv_all(fd, nng_msg_body(m), len - 4, timeout_ms)
	    && cohort__wire_unpack_reply(m, &rep, &pl, &plen) == COHORT_OK) {
		st = rep->status;
		cohort__reply__free_unpacked(rep, NULL);
	}
	nng_msg_free(m);
	return (st);
}

/* A real client: connects to the cohort port, authenticates with a request
 * of job/token, gets its reply. Milliseconds it took, or -1. */
static inline int64_t
chaos_real_client(int port, const char *job, const char *token, int timeout_ms)
{
	static uint64_t id = 0x7e57000000000000ull;
	int64_t t0 = th_now_ms();
	int fd = chaos_connect_from(NULL, port);
	int st;

	if (fd < 0)
		return (-1);
	st = chaos_sp_request(fd, true, job, token, ++id, 1, timeout_ms);
	close(fd);
	return (st == COHORT_OK ? th_now_ms() - t0 : -1);
}

/* GET path over HTTP from port within timeout_ms: the status code, or
 * -1. */
static inline int
chaos_http_get(int port, const char *path, int timeout_ms)
{
	char req[256], buf[512];
	int fd = chaos_connect_from(NULL, port), code = -1;
	size_t got = 0;
	int64_t end = th_now_ms() + timeout_ms;

	if (fd < 0)
		return (-1);
	snprintf(req, sizeof(req),
	    "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
	if (!chaos_send_all(fd, req, strlen(req), timeout_ms)) {
		close(fd);
		return (-1);
	}
	while (got < 12 && th_now_ms() < end) {
		struct pollfd pf = { fd, POLLIN, 0 };
		ssize_t k;
		if (poll(&pf, 1, (int)(end - th_now_ms())) != 1)
			break;
		if ((k = recv(fd, buf + got, sizeof(buf) - 1 - got, 0)) <= 0)
			break;
		got += (size_t)k;
	}
	buf[got] = '\0';
	if (got >= 12 && strncmp(buf, "HTTP/1.", 7) == 0)
		code = (int)strtol(buf + 9, NULL, 10);
	close(fd);
	return (code);
}

#endif /* COHORT_CHAOS_H */
