/*
 * test_torchstore.c - cohortd's TCPStore listener (--torch-store) with a
 * raw-socket client of our own: every query's bytes on the wire, a WAIT
 * released from another connection and one cancelled, queues, two
 * listeners kept apart, what a client sent before it closed applied,
 * wake-ups reaching every waiter, and bad input closing only its
 * connection; the door (issue 22 finding 1): a process of another user
 * on this host gets nothing, under --require-token too, and who the
 * listener lets in from elsewhere (in-process). The
 * real torch client is tested in python/tests/test_tcpstore.py; this suite
 * runs where torch is not, and under ASan and valgrind (the harness runs
 * cohortd under memcheck with COHORT_TEST_VALGRIND=1).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_cohort.h"
#include "core/clients.h"
#include "core/pipes.h"
#include "front/door.h"
#include "front/events.h"
#include "state/lifecycle.h"
#include "../unit/srv_req.h"

enum {
	Q_VALIDATE = 0,
	Q_SET = 1,
	Q_COMPARE_SET = 2,
	Q_GET = 3,
	Q_ADD = 4,
	Q_CHECK = 5,
	Q_WAIT = 6,
	Q_GETNUMKEYS = 7,
	Q_DELETE_KEY = 8,
	Q_APPEND = 9,
	Q_MULTI_GET = 10,
	Q_MULTI_SET = 11,
	Q_CANCEL_WAIT = 12,
	Q_PING = 13,
	Q_QUEUE_PUSH = 14,
	Q_QUEUE_POP = 15,
	Q_QUEUE_LEN = 16,
	Q_LIST = 17,
	Q_BARRIER = 18,
};

static int port_a, port_b;

static void
setup(void)
{
	static char a[64], b[64];
	const char *args[] = { "--torch-store", a, "--torch-store", b,
		"--torch-store-timeout", "400", NULL };

	port_a = th_free_port();
	do
		port_b = th_free_port();
	while (port_b == port_a);
	snprintf(a, sizeof(a), "jobA@127.0.0.1:%d", port_a);
	snprintf(b, sizeof(b), "jobB@127.0.0.1:%d", port_b);
	th_coord_start(&th_fx_coord, args);
}

/* --- a minimal client -------------------------------------------------- */

struct buf {
	unsigned char b[1 << 16];
	size_t n;
};

static void
b_u8(struct buf *b, unsigned v)
{
	b->b[b->n++] = (unsigned char)v;
}

static void
b_u64(struct buf *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b->b[b->n++] = (unsigned char)(v >> (8 * i));
}

static void
b_str(struct buf *b, const char *s)
{
	size_t n = strlen(s);

	b_u64(b, n);
	memcpy(b->b + b->n, s, n);
	b->n += n;
}

static int
ts_open(int port, bool validate)
{
	int fd = th_tcp_connect_ok(port);

	if (validate) {
		struct buf b = { .n = 0 };
		uint32_t m = 0x3C85F7CEu;
		b_u8(&b, Q_VALIDATE);
		memcpy(b.b + b.n, &m, 4);
		b.n += 4;
		ck_assert_int_eq(write(fd, b.b, b.n), (ssize_t)b.n);
	}
	return (fd);
}

/* A query: its byte, then up to two strings (NULL: none). */
static void
b_req(struct buf *b, unsigned q, const char *s1, const char *s2)
{
	b_u8(b, q);
	if (s1 != NULL)
		b_str(b, s1);
	if (s2 != NULL)
		b_str(b, s2);
}

static void
ts_send(int fd, const struct buf *b)
{
	ck_assert_int_eq(write(fd, b->b, b->n), (ssize_t)b->n);
}

/* Sends a query of its byte alone. */
static void
ts_query(int fd, unsigned q)
{
	struct buf b = { .n = 0 };

	b_u8(&b, q);
	ts_send(fd, &b);
}

/* Reads exactly n bytes within timeout_ms; false on timeout or close. */
static bool
ts_read(int fd, void *out, size_t n, int timeout_ms)
{
	size_t got = 0;

	while (got < n) {
		struct pollfd p = { fd, POLLIN, 0 };
		ssize_t r;
		if (poll(&p, 1, timeout_ms) <= 0)
			return (false);
		r = read(fd, (char *)out + got, n - got);
		if (r <= 0)
			return (false);
		got += (size_t)r;
	}
	return (true);
}

static uint64_t
ts_u64(int fd)
{
	uint64_t v;

	ck_assert_msg(ts_read(fd, &v, 8, 5000), "no u64 reply");
	return (v);
}

static uint8_t
ts_u8(int fd)
{
	uint8_t v;

	ck_assert_msg(ts_read(fd, &v, 1, 5000), "no u8 reply");
	return (v);
}

/* A byte-string reply, NUL-terminated (static buffer). */
static const char *
ts_bytes(int fd)
{
	static char s[4096];
	uint64_t n = ts_u64(fd);

	ck_assert_uint_lt(n, sizeof(s));
	ck_assert_msg(ts_read(fd, s, (size_t)n, 5000), "short bytes");
	s[n] = '\0';
	return (s);
}

/* True if the server closed fd within timeout_ms. */
static bool
ts_closed(int fd, int timeout_ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	char c;

	if (poll(&p, 1, timeout_ms) <= 0)
		return (false);
	return (read(fd, &c, 1) <= 0);
}

static void
q_set(int fd, const char *k, const char *v)
{
	struct buf b = { .n = 0 };

	b_req(&b, Q_SET, k, v);
	ts_send(fd, &b);
}

static const char *
q_get(int fd, const char *k)
{
	struct buf b = { .n = 0 };

	b_req(&b, Q_GET, k, NULL);
	ts_send(fd, &b);
	return (ts_bytes(fd));
}

static const char *
q_cas(int fd, const char *k, const char *expect, const char *desired)
{
	struct buf b = { .n = 0 };

	b_u8(&b, Q_COMPARE_SET);
	b_str(&b, k);
	b_str(&b, expect);
	b_str(&b, desired);
	ts_send(fd, &b);
	return (ts_bytes(fd));
}

static void
q_keys(int fd, int q, const char *k1, const char *k2)
{
	struct buf b = { .n = 0 };

	b_u8(&b, (unsigned)q);
	b_u64(&b, k2 != NULL ? 2 : 1);
	b_str(&b, k1);
	if (k2 != NULL)
		b_str(&b, k2);
	ts_send(fd, &b);
}

/* --- tests --------------------------------------------------------------- */

START_TEST(test_every_query)
{
	int fd = ts_open(port_a, true);
	struct buf b = { .n = 0 };
	uint32_t nonce = 0x12345678, echo = 0;

	b_u8(&b, Q_PING);
	memcpy(b.b + b.n, &nonce, 4);
	b.n += 4;
	ts_send(fd, &b);
	ck_assert(ts_read(fd, &echo, 4, 5000) && echo == nonce);

	q_set(fd, "/k", "v");
	ck_assert_str_eq(q_get(fd, "/k"), "v");
	ck_assert_str_eq(q_get(fd, "/missing"), ""); /* as torch's server */

	b.n = 0;
	b_u8(&b, Q_ADD);
	b_str(&b, "/c");
	b_u64(&b, (uint64_t)5);
	ts_send(fd, &b);
	ck_assert_int_eq((int64_t)ts_u64(fd), 5);
	b.n = 0;
	b_u8(&b, Q_ADD);
	b_str(&b, "/c");
	b_u64(&b, (uint64_t)(int64_t)-7);
	ts_send(fd, &b);
	ck_assert_int_eq((int64_t)ts_u64(fd), -2);
	ck_assert_str_eq(q_get(fd, "/c"), "-2");

	/* compare_set: torch's four cases */
	ck_assert_str_eq(q_cas(fd, "/n", "", "x"), "x");
	ck_assert_str_eq(q_cas(fd, "/m", "exp", "y"), "exp");
	q_keys(fd, Q_CHECK, "/m", NULL);
	ck_assert_int_eq(ts_u8(fd), 1); /* not ready: nothing was set */
	ck_assert_str_eq(q_cas(fd, "/n", "x", "z"), "z");
	ck_assert_str_eq(q_cas(fd, "/n", "q", "w"), "z");

	q_keys(fd, Q_CHECK, "/k", "/n");
	ck_assert_int_eq(ts_u8(fd), 0);

	b.n = 0;
	b_req(&b, Q_APPEND, "/a", "12");
	b_req(&b, Q_APPEND, "/a", "3");
	ts_send(fd, &b); /* two pipelined queries without replies */
	q_keys(fd, Q_MULTI_GET, "/a", "/k");
	ck_assert_str_eq(ts_bytes(fd), "123");
	ck_assert_str_eq(ts_bytes(fd), "v");

	b.n = 0;
	b_u8(&b, Q_MULTI_SET);
	b_u64(&b, 2);
	b_str(&b, "/m1");
	b_str(&b, "x1");
	b_str(&b, "/m2");
	b_str(&b, "x2");
	ts_send(fd, &b);
	ck_assert_str_eq(q_get(fd, "/m2"), "x2");

	b.n = 0;
	b_req(&b, Q_DELETE_KEY, "/m1", NULL);
	b_req(&b, Q_DELETE_KEY, "/m1", NULL);
	ts_send(fd, &b);
	ck_assert_uint_eq(ts_u64(fd), 1);
	ck_assert_uint_eq(ts_u64(fd), 0);

	b.n = 0;
	b_u8(&b, Q_GETNUMKEYS);
	ts_send(fd, &b);
	ck_assert_uint_eq(ts_u64(fd), 5); /* k c n a m2 */
	b.n = 0;
	b_u8(&b, Q_LIST);
	ts_send(fd, &b);
	ck_assert_uint_eq(ts_u64(fd), 5);
	for (int i = 0; i < 5; i++) {
		const char *k = ts_bytes(fd);
		ck_assert_msg(strcmp(k, "/k") == 0 || strcmp(k, "/c") == 0
		        || strcmp(k, "/n") == 0 || strcmp(k, "/a") == 0
		        || strcmp(k, "/m2") == 0,
		    "unexpected key %s", k);
	}
	close(fd);
}
END_TEST

START_TEST(test_wait_released_and_cancelled)
{
	int a = ts_open(port_a, true), b = ts_open(port_a, true);
	uint8_t r;

	/* A wait parks; another connection's set releases it. */
	q_keys(a, Q_WAIT, "/w1", "/w2");
	ck_assert(!ts_read(a, &r, 1, 300));
	q_set(b, "/w1", "1");
	ck_assert(!ts_read(a, &r, 1, 200)); /* one of two */
	q_set(b, "/w2", "2");
	ck_assert_int_eq(ts_u8(a), 0); /* STOP_WAITING */
	/* A wait for a key that exists answers at once. */
	q_keys(a, Q_WAIT, "/w1", NULL);
	ck_assert_int_eq(ts_u8(a), 0);
	/* Cancelled while parked: WAIT_CANCELED only, and the connection
	 * goes on. */
	q_keys(a, Q_WAIT, "/never", NULL);
	ck_assert(!ts_read(a, &r, 1, 200));
	ts_query(a, Q_CANCEL_WAIT);
	ck_assert_int_eq(ts_u8(a), 1);
	ck_assert_str_eq(q_get(a, "/w2"), "2");
	/* Cancel after the wait ended: WAIT_CANCELED (torch's client reads
	 * STOP_WAITING, then this). */
	ts_query(a, Q_CANCEL_WAIT);
	ck_assert_int_eq(ts_u8(a), 1);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_queues)
{
	int a = ts_open(port_a, true), b = ts_open(port_a, true);
	struct buf q = { .n = 0 };
	uint8_t r;

	b_req(&q, Q_QUEUE_PUSH, "/q", "one");
	b_req(&q, Q_QUEUE_PUSH, "/q", "two");
	b_req(&q, Q_QUEUE_LEN, "/q", NULL);
	ts_send(a, &q);
	ck_assert_uint_eq(ts_u64(a), 2);
	q.n = 0;
	b_req(&q, Q_QUEUE_POP, "/q", NULL);
	ts_send(a, &q);
	ck_assert_uint_eq(ts_u64(a), 2); /* the length before the pop */
	ck_assert_str_eq(ts_bytes(a), "one");
	ts_send(a, &q);
	ck_assert_uint_eq(ts_u64(a), 1);
	ck_assert_str_eq(ts_bytes(a), "two");
	ts_send(a, &q);
	ck_assert_uint_eq(ts_u64(a), 0); /* empty: nothing follows */
	/* A queue is not a key: CHECK sees it only while non-empty. */
	q_keys(a, Q_CHECK, "/q", NULL);
	ck_assert_int_eq(ts_u8(a), 1);
	/* A WAIT on a queue name is released by a push (queue_pop with
	 * block=True waits so). */
	q_keys(b, Q_WAIT, "/q", NULL);
	ck_assert(!ts_read(b, &r, 1, 200));
	q.n = 0;
	b_req(&q, Q_QUEUE_PUSH, "/q", "three");
	ts_send(a, &q);
	ck_assert_int_eq(ts_u8(b), 0);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_two_listeners_two_jobs)
{
	int a = ts_open(port_a, true), b = ts_open(port_b, true);
	struct buf n = { .n = 0 };

	q_set(a, "/secret", "A");
	ck_assert_str_eq(q_get(a, "/secret"), "A");
	ck_assert_str_eq(q_get(b, "/secret"), "");
	b_u8(&n, Q_GETNUMKEYS);
	ts_send(b, &n);
	ck_assert_uint_eq(ts_u64(b), 0);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_nothing_sent_before_close_is_lost)
{
	struct buf b;
	int fd;

	/* 50 clients each send three SETs, an APPEND and an ADD and close
	 * at once, reading nothing (a SET has no reply). */
	for (int i = 0; i < 50; i++) {
		char k[32];
		fd = ts_open(port_a, true);
		b.n = 0;
		for (int j = 0; j < 3; j++) {
			snprintf(k, sizeof(k), "/c%d_%d", i, j);
			b_req(&b, Q_SET, k, "v");
		}
		snprintf(k, sizeof(k), "/c%d_a", i);
		b_req(&b, Q_APPEND, k, "x");
		b_req(&b, Q_ADD, "/closed", NULL);
		b_u64(&b, 1);
		ts_send(fd, &b);
		close(fd);
	}
	/* One more: SETs, a WAIT nobody will answer, then a request cut
	 * in its middle; the SETs stay, the rest goes with the client. */
	fd = ts_open(port_a, true);
	b.n = 0;
	b_req(&b, Q_SET, "/before_wait", "1");
	b_u8(&b, Q_WAIT);
	b_u64(&b, 1);
	b_str(&b, "/never");
	ts_send(fd, &b);
	close(fd);
	fd = ts_open(port_a, true);
	b.n = 0;
	b_req(&b, Q_SET, "/before_cut", "1");
	b_u8(&b, Q_SET);
	b_u64(&b, 10);
	memcpy(b.b + b.n, "/cu", 3);
	b.n += 3;
	ts_send(fd, &b);
	close(fd);

	fd = ts_open(port_a, true);
	for (int i = 0; i < 50; i++) {
		char k[32];
		for (int j = 0; j < 3; j++) {
			snprintf(k, sizeof(k), "/c%d_%d", i, j);
			q_keys(fd, Q_WAIT, k, NULL);
			ck_assert_msg(ts_u8(fd) == 0, "%s lost", k);
		}
		snprintf(k, sizeof(k), "/c%d_a", i);
		q_keys(fd, Q_WAIT, k, NULL);
		ck_assert_msg(ts_u8(fd) == 0, "%s lost", k);
	}
	q_keys(fd, Q_WAIT, "/before_wait", "/before_cut");
	ck_assert_int_eq(ts_u8(fd), 0);
	ck_assert_str_eq(q_get(fd, "/closed"), "50");
	close(fd);
}
END_TEST

START_TEST(test_barrier_of_count_below_one)
{
	int fd = ts_open(port_a, true);
	const int64_t counts[] = { 0, -1 };

	/* torch's server counts the arrival and answers at once. */
	for (size_t i = 0; i < 2; i++) {
		struct buf b = { .n = 0 };
		b_req(&b, Q_BARRIER, "/b", NULL);
		b_u64(&b, (uint64_t)counts[i]);
		ts_send(fd, &b);
		ck_assert_int_eq(ts_u8(fd), 0); /* STOP_WAITING */
	}
	ck_assert_str_eq(q_get(fd, "/b"), "2");
	close(fd);
}
END_TEST

START_TEST(test_every_waiter_woken)
{
	int w[3], pusher = ts_open(port_a, true);
	struct buf b;
	uint8_t r;

	/* Three WAITs on one key: one SET wakes all three. */
	for (int i = 0; i < 3; i++) {
		w[i] = ts_open(port_a, true);
		q_keys(w[i], Q_WAIT, "/k3", NULL);
	}
	ck_assert(!ts_read(w[0], &r, 1, 200));
	q_set(pusher, "/k3", "x");
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(ts_u8(w[i]), 0);
	/* Three WAITs on a queue (queue_pop with block=True): each of
	 * three pushes wakes one of them. */
	for (int i = 0; i < 3; i++)
		q_keys(w[i], Q_WAIT, "/q3", NULL);
	ck_assert(!ts_read(w[1], &r, 1, 200));
	for (int i = 0; i < 3; i++) {
		b.n = 0;
		b_req(&b, Q_QUEUE_PUSH, "/q3", "item");
		ts_send(pusher, &b);
	}
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(ts_u8(w[i]), 0);
	for (int i = 0; i < 3; i++)
		close(w[i]);
	close(pusher);
}
END_TEST

START_TEST(test_bad_input_closes_only_that_connection)
{
	int good = ts_open(port_a, true);
	static const struct {
		const char *name;
		bool validate;
		unsigned char bytes[32];
		size_t n;
	} cases[] = {
		{ "garbage", false, "GET / HTTP/1.1\r\n\r\n", 18 },
		{ "wrong magic", false, { 0, 0xef, 0xbe, 0xad, 0xde }, 5 },
		{ "query before VALIDATE", false, { Q_PING, 1, 2, 3, 4 }, 5 },
		{ "unknown query", true, { 99 }, 1 },
		{ "huge key", true, { Q_SET, 0, 0, 0, 0, 0, 1, 0, 0 }, 9 },
		{ "empty key", true, { Q_GET, 0, 0, 0, 0, 0, 0, 0, 0 }, 9 },
		{ "too many keys", true,
		    { Q_CHECK, 0, 0, 0, 0x40, 0, 0, 0, 0 }, 9 },
	};

	q_set(good, "/ok", "1");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int fd = ts_open(port_a, cases[i].validate);
		ck_assert_int_eq(write(fd, cases[i].bytes, cases[i].n),
		    (ssize_t)cases[i].n);
		ck_assert_msg(
		    ts_closed(fd, 3000), "%s: not closed", cases[i].name);
		close(fd);
	}
	{
		/* A value over --max-value-bytes (64 MiB by default). */
		int fd = ts_open(port_a, true);
		struct buf b = { .n = 0 };
		b_u8(&b, Q_SET);
		b_str(&b, "/k");
		b_u64(&b, (uint64_t)1 << 40);
		ts_send(fd, &b);
		ck_assert_msg(ts_closed(fd, 3000), "huge value: not closed");
		close(fd);
	}
	{
		/* Incomplete for longer than --torch-store-timeout (400 ms):
		 * closed; a validated idle connection is not. */
		int part = ts_open(port_a, true), idle = ts_open(port_a, true);
		struct buf b = { .n = 0 };
		b_u8(&b, Q_SET);
		b_u64(&b, 10);
		memcpy(b.b + b.n, "abc", 3);
		b.n += 3;
		ts_send(part, &b);
		ck_assert_msg(ts_closed(part, 3000), "partial request kept");
		ck_assert_msg(!ts_closed(idle, 800), "idle connection closed");
		close(part);
		close(idle);
	}
	/* The well-behaved client never noticed. */
	ck_assert_str_eq(q_get(good, "/ok"), "1");
	q_set(good, "/still", "fine");
	ck_assert_str_eq(q_get(good, "/still"), "fine");
	close(good);
}
END_TEST

/* --- the door (issue 22 finding 1) ------------------------------------- */

static int door_port;

static void
door_setup(void)
{
	static char admin[300], tok[300], job[400], store[64];
	const char *args[] = { "--require-token", "--admin-token-file", admin,
		"--job", job, "--torch-store", store, NULL };
	FILE *f;

	snprintf(admin, sizeof(admin), "%s/admin.secret", th_tmpdir());
	snprintf(tok, sizeof(tok), "%s/jobD.token", th_tmpdir());
	ck_assert_ptr_nonnull(f = fopen(admin, "w"));
	fputs("an admin secret\n", f);
	fclose(f);
	ck_assert_ptr_nonnull(f = fopen(tok, "w"));
	fputs("the token of jobD\n", f);
	fclose(f);
	snprintf(job, sizeof(job), "jobD:@%s", tok);
	door_port = th_free_port();
	snprintf(store, sizeof(store), "jobD@127.0.0.1:%d", door_port);
	th_coord_start(&th_fx_coord, args);
}

/* A process of user uid on this host asks the listener for everything
 * (LIST, GETNUMKEYS, GET) and tries to change it (SET, DELETE_KEY). Its
 * exit status: 0 if it got nothing back (closed), 1 if it got a byte, 2
 * if it got no answer at all, 3 if it could not become uid. */
static int
door_stranger(int port, uid_t uid)
{
	pid_t p = fork();
	int st;

	ck_assert_int_ge(p, 0);
	if (p == 0) {
		struct sockaddr_in a;
		struct buf b = { .n = 0 };
		uint32_t m = 0x3C85F7CEu;
		struct pollfd pf;
		char c;
		int fd;

		if (setgid((gid_t)uid) != 0 || setuid(uid) != 0)
			_exit(3);
		fd = socket(AF_INET, SOCK_STREAM, 0);
		memset(&a, 0, sizeof(a));
		a.sin_family = AF_INET;
		a.sin_port = htons((uint16_t)port);
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (fd < 0
		    || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
			_exit(2);
		b_u8(&b, Q_VALIDATE);
		memcpy(b.b + b.n, &m, 4);
		b.n += 4;
		b_u8(&b, Q_LIST);
		b_u8(&b, Q_GETNUMKEYS);
		b_req(&b, Q_GET, "/owned", NULL);
		b_req(&b, Q_SET, "/owned", "stolen");
		b_req(&b, Q_DELETE_KEY, "/owned", NULL);
		(void)!write(fd, b.b, b.n);
		pf.fd = fd;
		pf.events = POLLIN;
		if (poll(&pf, 1, 5000) != 1)
			_exit(2);
		_exit(read(fd, &c, 1) > 0 ? 1 : 0);
	}
	ck_assert_int_eq(waitpid(p, &st, 0), p);
	return (WIFEXITED(st) ? WEXITSTATUS(st) : 99);
}

START_TEST(test_door_stranger_gets_nothing)
{
	int owner = ts_open(door_port, true);
	struct buf b = { .n = 0 };
	int rc;

	/* The job's own user (cohortd's) is let in. */
	q_set(owner, "/owned", "mine");
	ck_assert_str_eq(q_get(owner, "/owned"), "mine");
	/* Another user of this host is refused at its first query. */
	rc = door_stranger(door_port, 65534);
	ck_assert_msg(rc == 0, "a stranger (uid 65534): %s",
	    rc == 1       ? "got an answer"
	        : rc == 2 ? "got neither an answer nor a close"
	                  : "could not run as uid 65534");
	/* It read nothing and changed nothing. */
	ck_assert_str_eq(q_get(owner, "/owned"), "mine");
	b_u8(&b, Q_GETNUMKEYS);
	ts_send(owner, &b);
	ck_assert_uint_eq(ts_u64(owner), 1);
	ck_assert(th_coord_log_has(&th_fx_coord, "uid 65534"));
	ck_assert(th_coord_log_has(&th_fx_coord, "not cohortd's user"));
	close(owner);
}
END_TEST

static struct sockaddr_storage
door_sa(const char *ip)
{
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (strchr(ip, ':') != NULL) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		s6->sin6_family = AF_INET6;
		ck_assert_int_eq(inet_pton(AF_INET6, ip, &s6->sin6_addr), 1);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		s4->sin_family = AF_INET;
		ck_assert_int_eq(inet_pton(AF_INET, ip, &s4->sin_addr), 1);
	}
	return (ss);
}

/* Who may come in from another host: --torch-store-allow, and the
 * addresses a client of the job is connected from with its token. */
START_TEST(test_door_other_hosts)
{
	const char *allow[] = { "10.1.0.0/16", "fd00::/8", "192.0.2.7" };
	struct srv_limits lim
	    = { 1u << 20, 1u << 24, 1000, 0, 0, 0, 0, 0, 0, 0 };
	struct srv_door *d;
	struct srv_core *core;
	struct srv_job *job;
	struct srv_client *cl;
	struct sockaddr_storage sa;
	uint8_t addr[4] = { 10, 9, 8, 7 };
	const char *bad[] = { "10.1.0.0/33", "nonsense", "10.0.0.0/x" };

	ck_assert_cohort_ok(srv_door_new(allow, 3, &d));
	sa = door_sa("10.1.200.3");
	ck_assert(srv_door_allowed(d, &sa));
	sa = door_sa("10.2.0.1");
	ck_assert(!srv_door_allowed(d, &sa));
	sa = door_sa("fd12::1");
	ck_assert(srv_door_allowed(d, &sa));
	sa = door_sa("fe80::1");
	ck_assert(!srv_door_allowed(d, &sa));
	sa = door_sa("::ffff:192.0.2.7"); /* IPv4 on an IPv6 socket */
	ck_assert(srv_door_allowed(d, &sa));
	sa = door_sa("192.0.2.8");
	ck_assert(!srv_door_allowed(d, &sa));
	srv_door_free(d);
	for (int i = 0; i < 3; i++)
		ck_assert_cohort_err(
		    srv_door_new(&bad[i], 1, &d), COHORT_EINVAL);

	/* A host with a client of the job connected (with its token: a
	 * client exists only once authenticated) is let in; others, and
	 * another job's, are not. */
	ck_assert_cohort_ok(
	    srv_core_new(&lim, NULL, srq_drop_reply, NULL, 1, &core));
	ck_assert_ptr_nonnull(job = srv_job_new(core, "j", "t"));
	ck_assert_ptr_nonnull(srv_job_new(core, "other", "t2"));
	ck_assert_ptr_nonnull(cl = srv_client_get(core, &job->clients, 5, 1));
	srv_pipe_opened(core, 77, 1);
	srv_pipe_set_addr(core, 77, addr, 4);
	srv_client_set_pipe(cl, 77);
	sa = door_sa("10.9.8.7");
	ck_assert(srv_door_job_host(core, "j", &sa));
	ck_assert(!srv_door_job_host(core, "other", &sa));
	ck_assert(!srv_door_job_host(core, "nosuch", &sa));
	sa = door_sa("10.9.8.6");
	ck_assert(!srv_door_job_host(core, "j", &sa));
	/* Gone with its connection. */
	srv_core_pipe_closed(core, 77, 2);
	sa = door_sa("10.9.8.7");
	ck_assert(!srv_door_job_host(core, "j", &sa));
	srv_core_free(core);
}
END_TEST

Suite *suite_integration_torchstore(void);

Suite *
suite_integration_torchstore(void)
{
	Suite *s = suite_create("integration_torchstore");

	th_suite_case(s, "listener", 60, setup, th_fx_teardown,
	    test_every_query, test_wait_released_and_cancelled, test_queues,
	    test_two_listeners_two_jobs,
	    test_nothing_sent_before_close_is_lost,
	    test_barrier_of_count_below_one, test_every_waiter_woken,
	    test_bad_input_closes_only_that_connection, NULL);
	th_suite_case(s, "door", 60, door_setup, th_fx_teardown,
	    test_door_stranger_gets_nothing, NULL);
	th_suite_case(
	    s, "door_decisions", 30, NULL, NULL, test_door_other_hosts, NULL);
	return (s);
}
