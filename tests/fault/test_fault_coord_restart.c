/*
 * test_fault_coord_restart.c - `kill -9` of a real cohortd running with
 * --state-dir, and a restart on the same address: keys, counters and
 * cached replies are intact (a retried add is applied once), and the
 * restart with 100k keys is measured. The "journal" cases: a full disk
 * (a 300 KiB tmpfs) acknowledges nothing it could not journal, and a
 * damaged log stops the start until `cohortd --recover`.
 *
 * The "restart" cases speak the wire protocol directly (one nng req
 * socket per connection, explicit client_id and seq), so they do not
 * depend on the client library's reconnection. The "reconnect" case runs
 * real cohort_client members through a restart: libcohort re-dials and
 * re-sends its in-flight requests (same client_id and seq) by itself.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check_cohort.h"
#include "cohort_impl.h"

Suite *suite_fault_coord_restart(void);

/* ------------------------------------------------------------------------ */
/* cohortd on a given port                                                  */
/* ------------------------------------------------------------------------ */

struct cr_coord {
	pid_t pid;
	int port;
	char url[64];
	char dir[256];
	char log[320];
	int starts;
};

/* Starts cohortd on c->port with --state-dir c->dir (and extra args);
 * returns the milliseconds until it accepted connections. */
static int64_t
cr_start(struct cr_coord *c, const char *const *extra)
{
	char *argv[32];
	int n = 0;
	int64_t t0 = th_now_ms(), end = t0 + 30000;
	char *url = c->url;

	snprintf(c->log, sizeof(c->log), "%s/cohortd-%d-%d.log", th_tmpdir(),
	    c->port, c->starts++);
	/* COHORT_TEST_VALGRIND=1: cohortd under memcheck (a leak or memory
	 * error makes its clean stop exit 99). */
	if (getenv("COHORT_TEST_VALGRIND") != NULL) {
		static char vlog[400];
		snprintf(vlog, sizeof(vlog), "--log-file=%s.vg", c->log);
		argv[n++] = "/usr/bin/valgrind";
		argv[n++] = "--leak-check=full";
		argv[n++] = "--errors-for-leak-kinds=definite,indirect";
		argv[n++] = "--error-exitcode=99";
		argv[n++] = vlog;
		end = t0 + 60000;
	}
	argv[n++] = (char *)th_bin("cohortd");
	argv[n++] = "--listen";
	argv[n++] = url;
	argv[n++] = "--state-dir";
	argv[n++] = c->dir;
	for (int i = 0; extra != NULL && extra[i] != NULL && n < 30; i++)
		argv[n++] = (char *)extra[i];
	argv[n] = NULL;
	c->pid = th_spawn(argv, NULL, c->log);
	while (th_now_ms() < end) {
		nng_socket s;
		int st;
		if (nng_req0_open(&s) == 0) {
			int rv = nng_dial(s, c->url, NULL, 0);
			nng_close(s);
			if (rv == 0)
				return (th_now_ms() - t0);
		}
		if (th_wait(c->pid, 0, &st)) {
			c->pid = -1;
			ck_abort_msg("cohortd exited (%d); log %s",
			    th_exit_code(st), c->log);
		}
		usleep(2000);
	}
	ck_abort_msg("cohortd did not listen on %s (log %s)", c->url, c->log);
	return (-1);
}

static void
cr_init(struct cr_coord *c)
{
	memset(c, 0, sizeof(*c));
	c->port = th_free_port();
	snprintf(c->url, sizeof(c->url), "tcp://127.0.0.1:%d", c->port);
	snprintf(c->dir, sizeof(c->dir), "%s/state-%d", th_tmpdir(), c->port);
}

static void
cr_kill9(struct cr_coord *c)
{
	th_kill(c->pid);
	c->pid = -1;
}

static void
cr_stop(struct cr_coord *c)
{
	int st;

	if (c->pid <= 0)
		return;
	kill(c->pid, SIGTERM);
	ck_assert_msg(th_wait(c->pid, 10000, &st), "cohortd did not stop");
	c->pid = -1;
	ck_assert_int_eq(th_exit_code(st), 0);
}

/* ------------------------------------------------------------------------ */
/* A raw client: explicit client_id and seq                                 */
/* ------------------------------------------------------------------------ */

struct cr_cli {
	nng_socket s;
	bool open;
	uint64_t id;
	uint64_t seq;
	uint64_t gen;
	int32_t rank;
};

static void
cr_connect(struct cr_cli *k, const char *url)
{
	if (k->open)
		nng_close(k->s);
	ck_assert_int_eq(nng_req0_open(&k->s), 0);
	nng_socket_set_ms(k->s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_ms(k->s, NNG_OPT_RECVTIMEO, 20000);
	nng_socket_set_size(k->s, NNG_OPT_RECVMAXSZ, 128u << 20);
	ck_assert_int_eq(nng_dial(k->s, url, NULL, 0), 0);
	k->open = true;
}

static void
cr_close(struct cr_cli *k)
{
	if (k->open)
		nng_close(k->s);
	k->open = false;
}

/* A reply, the message it came in and its payload (in the message):
 * cr_done frees them. */
struct cr_rep {
	Cohort__Reply *r;
	nng_msg *m;
	const uint8_t *pl;
	size_t plen;
};

/* Sends rq (seq 0 = the next one) and returns the reply (in *rep too;
 * the caller frees it with cr_done). */
static Cohort__Reply *
cr_call(struct cr_cli *k, Cohort__Request *rq, const void *pl, size_t plen,
    struct cr_rep *rep)
{
	struct cohort__iov iov = { pl, plen };

	rq->proto_version = COHORT_PROTO_VERSION;
	rq->job = "restart";
	rq->token = "tok";
	rq->client_id = k->id;
	if (rq->seq == 0)
		rq->seq = ++k->seq;
	rq->generation = k->gen;
	rq->rank = k->rank;
	ck_assert_cohort_ok(
	    cohort__wire_pack_request(rq, &iov, plen ? 1 : 0, &rep->m));
	ck_assert_int_eq(nng_sendmsg(k->s, rep->m, 0), 0);
	ck_assert_int_eq(nng_recvmsg(k->s, &rep->m, 0), 0);
	ck_assert_cohort_ok(
	    cohort__wire_unpack_reply(rep->m, &rep->r, &rep->pl, &rep->plen));
	return (rep->r);
}

static void
cr_done(struct cr_rep *rep)
{
	cohort__reply__free_unpacked(rep->r, NULL);
	nng_msg_free(rep->m);
}

/* Calls rq, which may be refused: its status, the reply's error text in
 * err (errlen 0: not wanted). */
static int32_t
cr_status(struct cr_cli *k, Cohort__Request *rq, const void *pl, size_t plen,
    char *err, size_t errlen)
{
	struct cr_rep p;
	int32_t st = cr_call(k, rq, pl, plen, &p)->status;

	snprintf(err, errlen, "%s", p.r->error != NULL ? p.r->error : "");
	cr_done(&p);
	return (st);
}

/* Calls and checks the status; returns nothing. */
static void
cr_ok(struct cr_cli *k, Cohort__Request *rq, const void *pl, size_t plen)
{
	char err[512];
	int32_t st = cr_status(k, rq, pl, plen, err, sizeof(err));

	ck_assert_msg(st == COHORT_OK, "%s: %s", cohort_status_name(st), err);
}

static void
cr_join(struct cr_cli *k)
{
	struct cr_rep p;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Join j = COHORT__JOIN__INIT;

	j.rank = 0;
	j.world_size = 1;
	j.host = "test";
	j.pid = (uint32_t)getpid();
	j.local_rank = -1;
	j.heartbeat_ms = 1000;
	j.dead_after_ms = 600000;
	rq.body_case = COHORT__REQUEST__BODY_JOIN;
	rq.join = &j;
	rq.timeout_ms = 10000;
	ck_assert_int_eq(cr_call(k, &rq, NULL, 0, &p)->status, COHORT_OK);
	k->gen = p.r->join->generation;
	k->rank = p.r->join->rank;
	cr_done(&p);
}

/* A fresh client with id that joins the job at url as the KV user. */
static void
cr_open(struct cr_cli *k, uint64_t id, const char *url)
{
	memset(k, 0, sizeof(*k));
	k->id = id;
	k->rank = -1;
	cr_connect(k, url);
	cr_join(k);
}

/* A set of key to val, which may be refused: its status, the reply's
 * error text in err (errlen 0: not wanted). */
static int32_t
cr_try_set(struct cr_cli *k, const char *key, const char *val, char *err,
    size_t errlen)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvSet s = COHORT__KV_SET__INIT;

	s.key = (char *)key;
	rq.body_case = COHORT__REQUEST__BODY_KV_SET;
	rq.kv_set = &s;
	return (cr_status(k, &rq, val, strlen(val), err, errlen));
}

static void
cr_set(struct cr_cli *k, const char *key, const char *val)
{
	char err[512];
	int32_t st = cr_try_set(k, key, val, err, sizeof(err));

	ck_assert_msg(st == COHORT_OK, "set %s: %s: %s", key,
	    cohort_status_name(st), err);
}

/* An add of delta to key (seq 0: the next) that may be refused: its
 * status (the value in *v if OK), the reply's error text in err. */
static int32_t
cr_try_add(struct cr_cli *k, const char *key, int64_t delta, uint64_t seq,
    int64_t *v, char *err, size_t errlen)
{
	struct cr_rep p;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvAdd a = COHORT__KV_ADD__INIT;
	int32_t st;

	a.key = (char *)key;
	a.delta = delta;
	rq.body_case = COHORT__REQUEST__BODY_KV_ADD;
	rq.kv_add = &a;
	rq.seq = seq;
	st = cr_call(k, &rq, NULL, 0, &p)->status;
	if (st == COHORT_OK)
		*v = p.r->kv_add->value;
	snprintf(err, errlen, "%s", p.r->error != NULL ? p.r->error : "");
	cr_done(&p);
	return (st);
}

static int64_t
cr_add(struct cr_cli *k, const char *key, int64_t delta, uint64_t seq)
{
	char err[512];
	int64_t v = 0;

	ck_assert_msg(
	    cr_try_add(k, key, delta, seq, &v, err, sizeof(err)) == COHORT_OK,
	    "add: %s", err);
	return (v);
}

/* The value of key as a string ("" if absent: returns false). */
static bool
cr_get(struct cr_cli *k, const char *key, char *buf, size_t len)
{
	struct cr_rep p;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvGet g = COHORT__KV_GET__INIT;
	size_t n;
	bool found;

	g.key = (char *)key;
	rq.body_case = COHORT__REQUEST__BODY_KV_GET;
	rq.kv_get = &g;
	ck_assert_int_eq(cr_call(k, &rq, NULL, 0, &p)->status, COHORT_OK);
	found = p.r->kv_get->found;
	n = p.plen < len ? p.plen : len - 1;
	memcpy(buf, p.pl, n);
	buf[n] = '\0';
	cr_done(&p);
	return (found);
}

static uint64_t
cr_num_keys(struct cr_cli *k)
{
	struct cr_rep p;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvNumKeys nk = COHORT__KV_NUM_KEYS__INIT;
	uint64_t n;

	rq.body_case = COHORT__REQUEST__BODY_KV_NUM_KEYS;
	rq.kv_num_keys = &nk;
	ck_assert_int_eq(cr_call(k, &rq, NULL, 0, &p)->status, COHORT_OK);
	n = p.r->kv_num_keys->count;
	cr_done(&p);
	return (n);
}

/* Sets keys [from, to) as "key-i" = "value-i" with multi_set batches. */
static void
cr_fill(struct cr_cli *k, int from, int to)
{
	enum { B = 1000 };
	static char kb[B][24];
	char *keys[B];
	uint64_t lens[B];
	char *vals = malloc((size_t)B * 24);
	size_t off;

	ck_assert_ptr_nonnull(vals);
	for (int i = from; i < to; i += B) {
		Cohort__Request rq = COHORT__REQUEST__INIT;
		Cohort__KvMultiSet ms = COHORT__KV_MULTI_SET__INIT;
		int n = to - i < B ? to - i : B;
		off = 0;
		for (int x = 0; x < n; x++) {
			int w;
			snprintf(kb[x], sizeof(kb[x]), "key-%d", i + x);
			keys[x] = kb[x];
			w = snprintf(vals + off, 24, "value-%d", i + x);
			lens[x] = (uint64_t)w;
			off += (size_t)w;
		}
		ms.n_keys = (size_t)n;
		ms.keys = keys;
		ms.n_value_lens = (size_t)n;
		ms.value_lens = lens;
		rq.body_case = COHORT__REQUEST__BODY_KV_MULTI_SET;
		rq.kv_multi_set = &ms;
		cr_ok(k, &rq, vals, off);
	}
	free(vals);
}

/* "state restored from ...: ... in N ms" from a log, or -1. */
static long
cr_replay_ms(const char *log)
{
	char *t = th_read_file(log);
	const char *p;
	long ms = -1;

	if (t != NULL && (p = strstr(t, "state restored from")) != NULL
	    && (p = strstr(p, " records in ")) != NULL)
		ms = strtol(p + 12, NULL, 10);
	free(t);
	return (ms);
}

/* ------------------------------------------------------------------------ */
/* Restart (raw protocol)                                                   */
/* ------------------------------------------------------------------------ */

START_TEST(test_kill9_keeps_keys_and_applies_add_once)
{
	struct cr_coord c;
	struct cr_cli k, f;
	char buf[64], key[32], want[32];
	uint64_t last;

	cr_init(&c);
	cr_start(&c, NULL);
	cr_open(&k, 0xabc, c.url);
	cr_fill(&k, 0, 1000);
	cr_set(&k, "hello", "world");
	for (int i = 1; i <= 5; i++)
		ck_assert_int_eq(cr_add(&k, "ctr", 1, 0), i);
	last = k.seq;

	/* kill -9, restart on the same address, same state directory. */
	cr_kill9(&c);
	cr_start(&c, NULL);
	/* The client re-sends the add whose reply it did not see: it is
	 * answered from the journalled reply cache, not added again. */
	cr_connect(&k, c.url);
	ck_assert_int_eq(cr_add(&k, "ctr", 1, last), 5);
	ck_assert(cr_get(&k, "ctr", buf, sizeof(buf)));
	ck_assert_str_eq(buf, "5");
	/* A fresh client sees everything. */
	memset(&f, 0, sizeof(f));
	f.id = 0xdef;
	f.rank = -1;
	f.gen = k.gen;
	cr_connect(&f, c.url);
	ck_assert_uint_eq(cr_num_keys(&f), 1002);
	ck_assert(cr_get(&f, "hello", buf, sizeof(buf)));
	ck_assert_str_eq(buf, "world");
	for (int i = 0; i < 1000; i += 37) {
		snprintf(key, sizeof(key), "key-%d", i);
		snprintf(want, sizeof(want), "value-%d", i);
		ck_assert(cr_get(&f, key, buf, sizeof(buf)));
		ck_assert_str_eq(buf, want);
	}
	ck_assert_int_eq(cr_add(&f, "ctr", 1, 0), 6);
	/* A clean stop keeps it as well. */
	cr_close(&k);
	cr_close(&f);
	cr_stop(&c);
	cr_start(&c, NULL);
	cr_connect(&f, c.url);
	ck_assert(cr_get(&f, "ctr", buf, sizeof(buf)));
	ck_assert_str_eq(buf, "6");
	cr_close(&f);
	cr_stop(&c);
}
END_TEST

/* Measured: the journal's cost per kv_set and add (round trips over
 * loopback, with and without --state-dir, per fsync mode) and a restart
 * with 100k keys. Bounds only catch pathologies. */
static double
cr_rate(struct cr_cli *k, bool add, int n)
{
	int64_t t0 = th_now_ms();
	char key[32];
	uint64_t ns0 = cohort__now_ns();

	(void)t0;
	for (int i = 0; i < n; i++) {
		if (add) {
			(void)cr_add(k, "bench-ctr", 1, 0);
		} else {
			snprintf(key, sizeof(key), "bench-%d", i);
			cr_set(k, key, "0123456789abcdef0123456789abcdef");
		}
	}
	return ((double)(cohort__now_ns() - ns0) / 1e3 / n);
}

START_TEST(test_restart_100k_keys_and_journal_cost)
{
	static const char *const modes[] = { NULL, "batch", "always" };
	struct cr_coord c;
	struct cr_cli k;
	const int n = 3000;
	int64_t up;
	long replay;
	char buf[64];

	for (int mi = 0; mi < 3; mi++) {
		const char *extra[3] = { "--fsync", modes[mi], NULL };
		double set, add;
		struct th_coord tc;

		cr_init(&c);
		/* Without --state-dir: th_coord_start. */
		if (modes[mi] == NULL)
			th_coord_start(&tc, NULL);
		else
			cr_start(&c, extra);
		cr_open(&k, 1, modes[mi] == NULL ? tc.url : c.url);
		set = cr_rate(&k, false, n);
		add = cr_rate(&k, true, n);
		cr_close(&k);
		if (modes[mi] == NULL)
			ck_assert_int_eq(th_coord_stop(&tc), 0);
		else
			cr_stop(&c);
		fprintf(stderr,
		    "MEASURE journal %s: kv_set %.1f us, add %.1f us per "
		    "round trip (%d each, loopback)\n",
		    modes[mi] ? modes[mi] : "off", set, add, n);
	}

	cr_init(&c);
	cr_start(&c, NULL);
	cr_open(&k, 2, c.url);
	cr_fill(&k, 0, 100000);
	ck_assert_int_eq(cr_add(&k, "ctr", 7, 0), 7);
	cr_close(&k);
	cr_kill9(&c);
	up = cr_start(&c, NULL);
	replay = cr_replay_ms(c.log);
	fprintf(stderr,
	    "MEASURE restart with 100k keys: listening after %" PRId64
	    " ms (replay %ld ms)\n",
	    up, replay);
	cr_connect(&k, c.url);
	ck_assert_uint_eq(cr_num_keys(&k), 100001);
	ck_assert(cr_get(&k, "key-99999", buf, sizeof(buf)));
	ck_assert_str_eq(buf, "value-99999");
	ck_assert(cr_get(&k, "ctr", buf, sizeof(buf)));
	ck_assert_str_eq(buf, "7");
	cr_close(&k);
	cr_stop(&c);
	ck_assert_int_lt(up, 10000);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Reconnection of real members (needs libcohort's reconnection)           */
/* ------------------------------------------------------------------------ */

struct cr_member {
	const char *url;
	int rank;
	cohort_client *c;
	cohort_status st;
	cohort_status bst;
	char err[512];
};

static void *
cr_member_open(void *arg)
{
	struct cr_member *m = arg;
	cohort_options o;

	th_member_options(&o, m->url, "reconnect", m->rank, 2);
	o.heartbeat_interval = 200;
	o.dead_after = 3000;
	o.op_timeout = 20000;
	o.backend = "service";
	m->st = cohort_client_open(&o, &m->c, 10000);
	if (m->st != COHORT_OK)
		cohort__strlcpy(m->err, cohort_last_error(), sizeof(m->err));
	return (NULL);
}

static void *
cr_member_barrier(void *arg)
{
	struct cr_member *m = arg;

	m->bst = cohort_barrier(cohort_client_world(m->c), "across", 20000);
	if (m->bst != COHORT_OK)
		cohort__strlcpy(m->err, cohort_last_error(), sizeof(m->err));
	return (NULL);
}

struct cr_waiter {
	cohort_client *c;
	cohort_status st;
	char err[512];
};

static void *
cr_member_kv_wait(void *arg)
{
	struct cr_waiter *w = arg;
	const char *keys[] = { "late" };

	w->st = cohort_kv_wait(w->c, keys, 1, 20000);
	if (w->st != COHORT_OK)
		cohort__strlcpy(w->err, cohort_last_error(), sizeof(w->err));
	return (NULL);
}

START_TEST(test_members_reconnect_and_carry_on)
{
	struct cr_waiter kw;
	pthread_t kth;
	struct cr_coord c;
	struct cr_member m[2];
	pthread_t th[2];
	int64_t v = 0;

	int64_t t_restart, t_done;

	cr_init(&c);
	cr_start(&c, NULL);
	memset(m, 0, sizeof(m));
	for (int i = 0; i < 2; i++) {
		m[i].url = c.url;
		m[i].rank = i;
		pthread_create(&th[i], NULL, cr_member_open, &m[i]);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(
		    m[i].st == COHORT_OK, "open %d: %s", i, m[i].err);
	}
	ck_assert_cohort_ok(cohort_kv_add(m[0].c, "ctr", 1, &v, 5000));
	ck_assert_cohort_ok(cohort_kv_set(m[0].c, "k", "v", 1, 5000));
	/* Rank 0 waits in a barrier, rank 1 in a KV wait, when cohortd is
	 * killed. */
	pthread_create(&th[0], NULL, cr_member_barrier, &m[0]);
	memset(&kw, 0, sizeof(kw));
	kw.c = m[1].c;
	pthread_create(&kth, NULL, cr_member_kv_wait, &kw);
	usleep(200 * 1000);
	cr_kill9(&c);
	usleep(300 * 1000);
	cr_start(&c, NULL);
	t_restart = th_now_ms();
	/* Rank 1 arrives after the restart: the barrier completes, the
	 * counter was not counted twice, and both keep working. */
	cr_member_barrier(&m[1]);
	pthread_join(th[0], NULL);
	t_done = th_now_ms();
	fprintf(stderr,
	    "MEASURE reconnect: barrier parked across kill -9 completed "
	    "%" PRId64 " ms after cohortd listened again\n",
	    t_done - t_restart);
	ck_assert_msg(m[0].bst == COHORT_OK, "rank 0 barrier: %s", m[0].err);
	ck_assert_msg(m[1].bst == COHORT_OK, "rank 1 barrier: %s", m[1].err);
	ck_assert_cohort_ok(cohort_kv_add(m[1].c, "ctr", 1, &v, 5000));
	ck_assert_int_eq(v, 2);
	/* The KV wait parked before the crash was parked again. */
	ck_assert_cohort_ok(cohort_kv_set(m[0].c, "late", "x", 1, 5000));
	pthread_join(kth, NULL);
	ck_assert_msg(kw.st == COHORT_OK, "kv wait: %s", kw.err);
	{
		void *val = NULL;
		size_t len = 0;
		ck_assert_cohort_ok(
		    cohort_kv_get(m[1].c, "k", &val, &len, 5000));
		ck_assert_uint_eq(len, 1);
		ck_assert(memcmp(val, "v", 1) == 0);
		free(val);
	}
	ck_assert_cohort_ok(cohort_client_error(m[0].c));
	ck_assert_cohort_ok(cohort_client_error(m[1].c));
	for (int i = 0; i < 2; i++)
		cohort_client_close(m[i].c);
	cr_stop(&c);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A full disk (a small tmpfs), then kill -9: every acknowledged add is     */
/* counted after the restart                                                */
/* ------------------------------------------------------------------------ */

/* GET path from 127.0.0.1:port; returns the HTTP status, body in buf. */
static int
cr_http_get(int port, const char *path, char *buf, size_t len)
{
	char req[128];
	size_t off = 0;
	ssize_t n;
	int fd = th_tcp_connect_ok(port);
	int code = -1;

	snprintf(req, sizeof(req),
	    "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while (off + 1 < len && (n = read(fd, buf + off, len - 1 - off)) > 0)
		off += (size_t)n;
	buf[off] = '\0';
	close(fd);
	if (strncmp(buf, "HTTP/1.", 7) == 0)
		code = (int)strtol(buf + 9, NULL, 10);
	return (code);
}

START_TEST(test_full_disk_kill9_loses_no_acknowledged_add)
{
	struct cr_coord c;
	struct cr_cli k;
	char http[32], buf[4096], ready[512], metrics[32768], err[1024];
	char key[32], val[80];
	int ready_code;
	const char *extra[] = { "--http", http, NULL };
	int hport = th_free_port();
	int64_t v, acked = 0, refused = 0, sets_ok = 0;

	cr_init(&c);
	snprintf(http, sizeof(http), "127.0.0.1:%d", hport);
	ck_assert_int_eq(mkdir(c.dir, 0700), 0);
	if (!th_tmpfs_mount(c.dir, "size=300k")) {
		fprintf(stderr,
		    "SKIP fault_coord_restart/full_disk: cannot "
		    "mount a tmpfs (needs root)\n");
		rmdir(c.dir);
		return;
	}
	cr_start(&c, extra);
	cr_open(&k, 0x5151, c.url);
	memset(val, 'x', sizeof(val) - 1);
	val[sizeof(val) - 1] = '\0';
	/* The reproduction: 3000 adds and 3000 sets on 300 KiB. */
	for (int i = 0; i < 3000; i++) {
		int32_t st = cr_try_add(&k, "ctr", 1, 0, &v, err, sizeof(err));
		if (st == COHORT_OK) {
			acked++;
		} else {
			ck_assert_msg(st == COHORT_EJOURNAL, "%s: %s",
			    cohort_status_name(st), err);
			ck_assert_msg(strstr(err, c.dir) != NULL, "%s", err);
			refused++;
		}
		snprintf(key, sizeof(key), "key-%d", i);
		if (cr_try_set(&k, key, val, NULL, 0) == COHORT_OK)
			sets_ok++;
	}
	fprintf(stderr,
	    "full disk (300 KiB tmpfs): %" PRId64 " adds acknowledged, "
	    "%" PRId64 " refused (EJOURNAL); %" PRId64 " sets acknowledged\n",
	    acked, refused, sets_ok);
	ready_code = cr_http_get(hport, "/readyz", ready, sizeof(ready));
	ck_assert_int_eq(
	    cr_http_get(hport, "/metrics", metrics, sizeof(metrics)), 200);

	/* kill -9 and a restart (on the still full disk): every
	 * acknowledged add is counted. */
	cr_kill9(&c);
	cr_start(&c, extra);
	cr_connect(&k, c.url);
	ck_assert(cr_get(&k, "ctr", buf, sizeof(buf)));
	fprintf(stderr,
	    "after kill -9: counter %s (acknowledged %" PRId64 ")\n", buf,
	    acked);
	ck_assert_int_eq(strtoll(buf, NULL, 10), acked);
	/* While it was full: refused with the reason, and said so. */
	ck_assert_int_gt(refused, 0);
	ck_assert_int_eq(ready_code, 503);
	ck_assert_msg(strstr(ready, "journal not writable") != NULL
	        && strstr(ready, c.dir) != NULL,
	    "%s", ready);
	ck_assert_ptr_nonnull(strstr(metrics, "cohort_journal_writable 0"));

	/* Room again: writes are accepted and /readyz is 200. */
	th_tmpfs_remount(c.dir, false, "size=8m");
	for (int i = 0; i < 40; i++) {
		if (cr_try_add(&k, "ctr", 1, 0, &v, err, sizeof(err))
		    == COHORT_OK)
			break;
		usleep(100000);
	}
	ck_assert_int_eq(v, acked + 1);
	ck_assert_int_eq(cr_http_get(hport, "/readyz", buf, sizeof(buf)), 200);
	cr_close(&k);
	cr_stop(&c);
	th_tmpfs_umount(c.dir);
	rmdir(c.dir);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Damage in the journal: the real cohortd refuses to start, then          */
/* --recover keeps every whole record                                       */
/* ------------------------------------------------------------------------ */

START_TEST(test_damaged_journal_refused_then_recovered)
{
	struct cr_coord c;
	struct cr_cli k;
	const char *recover[] = { "--recover", NULL };
	char path[400], buf[64], *log;
	struct stat sb;
	unsigned char b;
	char *argv[8];
	int fd, st;
	pid_t pid;

	cr_init(&c);
	cr_start(&c, NULL);
	cr_open(&k, 0x77, c.url);
	for (int i = 0; i < 100; i++) {
		char key[16];
		snprintf(key, sizeof(key), "k%d", i);
		cr_set(&k, key, "value");
	}
	cr_close(&k);
	cr_kill9(&c);
	/* One byte in the middle of log.0. */
	snprintf(path, sizeof(path), "%s/log.0", c.dir);
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_int_ge(fd = open(path, O_RDWR), 0);
	ck_assert_int_eq(pread(fd, &b, 1, sb.st_size / 2), 1);
	b ^= 0xff;
	ck_assert_int_eq(pwrite(fd, &b, 1, sb.st_size / 2), 1);
	close(fd);
	/* A plain start refuses, exit status 1, naming file and offset. */
	snprintf(c.log, sizeof(c.log), "%s/cohortd-damaged.log", th_tmpdir());
	argv[0] = (char *)th_bin("cohortd");
	argv[1] = "--listen";
	argv[2] = c.url;
	argv[3] = "--state-dir";
	argv[4] = c.dir;
	argv[5] = NULL;
	pid = th_spawn(argv, NULL, c.log);
	ck_assert_msg(th_wait(pid, 20000, &st), "cohortd did not exit");
	ck_assert_int_ne(th_exit_code(st), 0);
	log = th_read_file(c.log);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "log.0 is damaged at offset") != NULL
	        && strstr(log, "--recover") != NULL,
	    "%s", log);
	free(log);
	ck_assert_int_eq(stat(path, &sb), 0);
	/* --recover: listens, every key but the damaged batch's. */
	cr_start(&c, recover);
	cr_connect(&k, c.url);
	ck_assert_uint_eq(cr_num_keys(&k), 99);
	ck_assert(cr_get(&k, "k0", buf, sizeof(buf)));
	ck_assert(cr_get(&k, "k99", buf, sizeof(buf)));
	cr_close(&k);
	cr_stop(&c);
	/* The damaged log was kept aside; a plain start works now. */
	log = th_read_file(c.log);
	ck_assert_ptr_nonnull(strstr(log, "log.0.damaged-"));
	free(log);
	cr_start(&c, NULL);
	cr_connect(&k, c.url);
	ck_assert_uint_eq(cr_num_keys(&k), 99);
	cr_close(&k);
	cr_stop(&c);
}
END_TEST

Suite *
suite_fault_coord_restart(void)
{
	Suite *s = suite_create("fault_coord_restart");

	th_suite_case(s, "restart", 180, NULL, NULL,
	    test_kill9_keeps_keys_and_applies_add_once,
	    test_restart_100k_keys_and_journal_cost, NULL);
	th_suite_case(s, "journal", 300, NULL, NULL,
	    test_full_disk_kill9_loses_no_acknowledged_add,
	    test_damaged_journal_refused_then_recovered, NULL);
	th_suite_case(s, "reconnect", 120, NULL, NULL,
	    test_members_reconnect_and_carry_on, NULL);
	return (s);
}
